"""Flows ``evaluate`` (one checkpoint, per episode and per opponent) and ``nightly_evaluation``
(the newest checkpoint against the held-out population, one report per night)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import configured, logger, publish_markdown, settings_for
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.loop import RunPaths
from tasks import evaluate_checkpoint, prepare_model, seed_population, write_report
from tasks.pipeline import default_evaluation_dir
from tasks.refs import FileRef

SPLITS = {"all": ("train", "held_out"), "train": ("train",), "held_out": ("held_out",)}


def newest_checkpoint(root: str | Path) -> ckpt.Checkpoint | None:
    """The most recently written complete checkpoint under ``root`` (any run, any depth)."""
    found = [
        ckpt.Checkpoint.at(path)
        for path in Path(root).rglob(f"{ckpt.PREFIX}*")
        if path.is_dir() and not path.name.startswith(".") and ckpt.is_complete(path)
    ]
    return max(found, key=lambda c: (c.manifest.get("created", ""), (c.path / ckpt.MANIFEST).stat().st_mtime), default=None)


def checkpoint_ref(settings: Settings, checkpoint: str | None) -> FileRef | None:
    """An explicit checkpoint directory, else the run's final one (what the train flow last
    wrote, in ``final.json``), else its latest, else None (the base model)."""
    if checkpoint:
        return FileRef.of(checkpoint, "checkpoint")
    final = RunPaths.of(settings).root / "final.json"
    if final.is_file():
        recorded = json.loads(final.read_text())["checkpoint"]
        if recorded and Path(recorded).is_dir():
            return FileRef.of(recorded, "checkpoint")
    latest = ckpt.latest_checkpoint(RunPaths.of(settings).checkpoints)
    return FileRef.of(latest.path, "checkpoint") if latest else None


def play(settings: Settings, checkpoint: FileRef | None, splits: tuple[str, ...], out_dir: Path) -> dict[str, FileRef]:
    """Evaluation tables of ``checkpoint`` against every split, written into ``out_dir``."""
    config, flow_cfg = settings.raw, settings.flow
    model = configured(prepare_model, flow_cfg)(config)
    tables = {}
    for split in splits:
        result = configured(evaluate_checkpoint, flow_cfg)(config, model, checkpoint, split, str(out_dir))
        tables[split] = result["table"]
        for row in result["final"]:
            logger().info(f"{split} {row['opponent']}: first-episode win rate {row['first_win_rate']:.2f}, final "
                          f"{row['final_win_rate']:.2f}, final mean return {row['final_mean_return']:+.2f}")
    return tables


def report_on(settings: Settings, tables: dict[str, FileRef], checkpoint: FileRef | None, out_dir: Path,
              title: str) -> dict[str, Any]:
    """Write the report of evaluation ``tables`` into ``out_dir``; publish it as a Markdown artifact."""
    config, flow_cfg = settings.raw, settings.flow
    manifest = configured(seed_population, flow_cfg)(config)
    history = RunPaths.of(settings).metrics
    report = configured(write_report, flow_cfg)(
        config, manifest, tables, checkpoint, str(out_dir), FileRef.of(history) if history.is_file() else None
    )
    markdown = report["files"]["markdown"].resolve().read_text()
    publish_markdown(title, markdown, f"Evaluation report ({', '.join(tables)}) of {checkpoint.path if checkpoint else 'the base model'}")
    logger().info(f"report: {report['files']['markdown'].path}")
    return report


def evaluate_and_report(settings: Settings, checkpoint: FileRef | None, splits: tuple[str, ...], out_dir: Path,
                        title: str) -> dict[str, Any]:
    return report_on(settings, play(settings, checkpoint, splits, out_dir), checkpoint, out_dir, title)


@flow(name="evaluate")
def evaluate(overrides: list[str] | None = None, config_file: str | None = None, checkpoint: str | None = None,
             split: str | None = None, out_dir: str | None = None, report: bool = True) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (default: the run's final one; none yet: the base model) against
    the opponents of ``split`` (default ``eval.split``; ``all``: training and held-out), per
    episode and per opponent. The tables go to ``out_dir`` (default
    ``paths.evaluations/<run>/<checkpoint>``) and, with ``report``, the report beside them."""
    settings = settings_for(overrides, config_file)
    split = split or settings.eval.split
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    ref = checkpoint_ref(settings, checkpoint)
    directory = Path(out_dir) if out_dir else default_evaluation_dir(settings, ref)
    tables = play(settings, ref, SPLITS[split], directory)
    if not report:
        return {"directory": str(directory), "tables": tables}
    return report_on(settings, tables, ref, directory, f"{settings.run_name}-evaluation")


@flow(name="report")
def report(overrides: list[str] | None = None, config_file: str | None = None, evaluation_dir: str | None = None,
           out_dir: str | None = None) -> dict[str, Any]:
    """The generalisation report of the evaluation tables in ``evaluation_dir`` (default: those of
    the run's final checkpoint), written to ``out_dir`` (default ``paths.report``): JSON metrics,
    a Markdown table and plots (learning curves, success by episode per opponent)."""
    settings = settings_for(overrides, config_file)
    ref = checkpoint_ref(settings, None)
    source = Path(evaluation_dir) if evaluation_dir else default_evaluation_dir(settings, ref)
    tables = {split: FileRef.of(source / f"{split}.parquet") for split in ("train", "held_out")
              if (source / f"{split}.parquet").is_file()}
    if not tables:
        raise FileNotFoundError(f"no evaluation table (train.parquet, held_out.parquet) in {source}")
    target = Path(out_dir) if out_dir else Path(settings.paths.get("report", "artifacts/report"))
    return report_on(settings, tables, ref, target, f"{settings.run_name}-report")


@flow(name="nightly_evaluation")
def nightly_evaluation(overrides: list[str] | None = None, config_file: str | None = None) -> dict[str, Any]:
    """The newest checkpoint under ``flow.nightly_runs`` (default ``paths.runs``) against the
    held-out population; the report is kept per night under ``paths.nightly/<date>``."""
    from prefect.runtime import flow_run

    settings = settings_for(overrides, config_file)
    root = settings.flow.nightly_runs or settings.paths.get("runs", "artifacts/runs")
    newest = newest_checkpoint(root)
    if newest is None:
        logger().warning(f"no checkpoint under {root}: evaluating the base model")
    from zoneinfo import ZoneInfo

    from flows.deploy import local_timezone

    zone = ZoneInfo(settings.flow.timezone or local_timezone())
    scheduled = flow_run.scheduled_start_time  # the night it was scheduled for, in the schedule's zone
    night = (scheduled or datetime.now(zone)).astimezone(zone).strftime("%Y-%m-%d")
    out_dir = Path(settings.paths.get("nightly", "artifacts/nightly")) / night
    ref = FileRef.of(newest.path, "checkpoint") if newest else None
    logger().info(f"nightly evaluation {night}: {ref.path if ref else 'base model'} -> {out_dir}")
    return evaluate_and_report(settings, ref, ("held_out",), out_dir, f"nightly-{night}")
