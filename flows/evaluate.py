"""Flows ``evaluate`` (one checkpoint, per episode and per opponent) and ``nightly_evaluation``
(the newest checkpoint against the held-out population, one report per night)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import local_timezone, logger, settings_for, task_runners
from mage import exploitability, io
from mage.evaluation import EXPLOITABILITY_FILE, recorded_policy, same_policy, same_sampling
from mage.run.layout import RunLayout, evaluation_dir
from mage.sections import SPLITS, splits_of
from mage.settings import Settings
from tasks.artifacts import publish_markdown
from tasks.caching import configured
from tasks.evaluation import evaluate_split, measure_exploitability, recorded_checkpoint, write_report
from tasks.model import prepare_model
from tasks.population import seed_population
from tasks.ray_workers import shard_options
from tasks.refs import FileRef


def checkpoint_ref(settings: Settings, checkpoint: str | None, run: str | None = None) -> FileRef | None:
    """An explicit checkpoint directory, else the final one of run ``run`` (default: the
    configured ``run.name``; :meth:`RunLayout.final_checkpoint`), else None (the base model)."""
    if checkpoint:
        return FileRef.of(checkpoint, "checkpoint")
    found = RunLayout.of(settings, run).final_checkpoint()
    return FileRef.of(str(found), "checkpoint") if found is not None else None


def play(settings: Settings, checkpoint: FileRef | None, splits: tuple[str, ...], out_dir: Path) -> dict[str, FileRef]:
    """Evaluation tables of ``checkpoint`` against every split, written into ``out_dir``."""
    flow_cfg = settings.flow
    model = configured(prepare_model, flow_cfg)(settings)
    play_split = configured(evaluate_split, flow_cfg)
    measure = configured(measure_exploitability, flow_cfg) if exploitability.measured(settings) else None
    if flow_cfg.runner == "ray":  # one task per split, side by side on the cluster
        with task_runners(settings, 0) as split_runner, shard_options(flow_cfg):
            futures = {split: split_runner.submit(play_split, {"settings": settings, "model": model,
                                                                   "checkpoint": checkpoint, "split": split,
                                                                   "out_dir": str(out_dir)})
                       for split in splits}
            measured = measure and split_runner.submit(measure, {"settings": settings, "model": model,
                                                                 "checkpoint": checkpoint, "out_dir": str(out_dir)})
            results = {split: future.result() for split, future in futures.items()}
            found = measured.result() if measured else None
    else:  # in this process, one after the other (a vLLM engine is one per process)
        results = {split: play_split(settings, model, checkpoint, split, str(out_dir)) for split in splits}
        found = measure(settings, model, checkpoint, str(out_dir)) if measure else None
    if found is not None:
        figures = io.read_json(found.resolve())
        logger().info(f"exploitability {figures['exploitability']:.4f} chips per hand (NashConv "
                      f"{figures['nash_conv']:.4f}; against a best response "
                      f"{figures['value_vs_best_response']['mean']:+.4f})")
    tables = {}
    for split, result in results.items():
        tables[split] = result["table"]
        for row in result["final"]:
            logger().info(f"{split} {row['opponent']}: first-episode win rate {row['first_win_rate']:.2f}, final "
                          f"{row['final_win_rate']:.2f}, final mean return {row['final_mean_return']:+.2f}")
    return tables


def tables_in(directory: Path) -> dict[str, FileRef]:
    """The evaluation tables (``train.parquet``, ``held_out.parquet``) that ``directory`` holds."""
    return {split: FileRef.of(directory / f"{split}.parquet") for split in SPLITS
            if (directory / f"{split}.parquet").is_file()}


def exploitability_beside(tables: dict[str, FileRef] | None) -> FileRef | None:
    """The ``exploitability.json`` that the evaluation which wrote ``tables`` wrote beside them (Kuhn Poker)."""
    if not tables:
        return None
    found = Path(next(iter(tables.values())).path).parent / EXPLOITABILITY_FILE
    return FileRef.of(found) if found.is_file() else None


def report_on(settings: Settings, tables: dict[str, FileRef], checkpoint: FileRef | None, out_dir: Path,
              title: str, start_tables: dict[str, FileRef] | None = None, policy: dict[str, Any] | None = None,
              compared_with: str | None = None) -> dict[str, Any]:
    """Write the report of evaluation ``tables`` (beside the starting policy's ``start_tables``;
    ``policy`` and ``compared_with`` as in :func:`tasks.evaluation.write_report`) into
    ``out_dir``; publish it as a Markdown artifact."""
    flow_cfg = settings.flow
    manifest = configured(seed_population, flow_cfg)(settings)
    history = RunLayout.of(settings).metrics
    report = configured(write_report, flow_cfg)(
        settings, manifest, tables, checkpoint, str(out_dir), FileRef.of(history) if history.is_file() else None,
        start_tables or None, policy, compared_with, exploitability_beside(tables), exploitability_beside(start_tables),
    )
    markdown = report["files"]["markdown"].resolve().read_text()
    publish_markdown(title, markdown, f"Evaluation report ({', '.join(tables)}) of "
                                      f"{checkpoint.path if checkpoint else 'the starting policy'}")
    for split in tables:
        if f"{split}/gain_over_start" in report["metrics"]:
            metrics = report["metrics"]
            logger().info(f"{split}: final-episode win rate {metrics[f'{split}/start_final_win_rate']:.3f} at the start, "
                          f"{metrics[f'{split}/final_win_rate']:.3f} now ({metrics[f'{split}/gain_over_start']:+.3f})")
    logger().info(f"report: {report['files']['markdown'].path}")
    return report


def evaluate_and_report(settings: Settings, checkpoint: FileRef | None, splits: tuple[str, ...], out_dir: Path,
                        title: str) -> dict[str, Any]:
    """Play ``checkpoint`` and, for the comparison, the starting policy on the same initial states; report."""
    tables = play(settings, checkpoint, splits, out_dir)
    start = None if checkpoint is None else play(settings, None, splits, evaluation_dir(settings, None))
    return report_on(settings, tables, checkpoint, out_dir, title, start)


@flow(name="evaluate")
def evaluate(overrides: list[str] | None = None, config_file: str | None = None, checkpoint: str | None = None,
             split: str | None = None, out_dir: str | None = None, report: bool = True,
             start: bool = False) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (default: the run's final one; none yet: the starting policy),
    or with ``start`` the starting policy itself (the tiny warm start or the base model),
    against the opponents of ``split`` (default ``eval.split``; ``all``: training and
    held-out), per episode and per opponent. The tables go to ``out_dir`` (default
    ``paths.evaluations/<run>/<checkpoint>``, or ``paths.start_evaluation``) and, with
    ``report``, the report beside them, with a checkpoint compared to the starting policy."""
    settings = settings_for(overrides, config_file)
    splits = splits_of(split or settings.eval.split)
    if start and checkpoint:
        raise ValueError("give a checkpoint or start=True (the starting policy), not both")
    ref = None if start else checkpoint_ref(settings, checkpoint)
    directory = Path(out_dir) if out_dir else evaluation_dir(settings, ref.path if ref else None)
    if not report:
        return {"directory": str(directory), "tables": play(settings, ref, splits, directory)}
    return evaluate_and_report(settings, ref, splits, directory, f"{settings.run_name}-evaluation")


@flow(name="report")
def report(overrides: list[str] | None = None, config_file: str | None = None, evaluation_dir: str | None = None,
           out_dir: str | None = None, start_dir: str | None = None) -> dict[str, Any]:
    """The report of the evaluation tables in ``evaluation_dir`` (default: those of the run's
    final checkpoint) beside the starting policy's in ``start_dir`` (default
    ``paths.start_evaluation``, if it holds the same splits), written to ``out_dir`` (default
    ``paths.report``): JSON, metrics, Markdown and plots (gains over the start, success by
    episode, learning curves). The tables' own record names the policy and sampling. Only a
    report of the run's final checkpoint against its starting policy updates ``paths.metrics``."""
    settings = settings_for(overrides, config_file)
    final = checkpoint_ref(settings, None)
    source = Path(evaluation_dir) if evaluation_dir else evaluation_dir(settings, final.path if final else None)
    tables = tables_in(source)
    if not tables:
        raise FileNotFoundError(f"no evaluation table (train.parquet, held_out.parquet) in {source}")
    recorded = recorded_policy({split: ref.path for split, ref in tables.items()})
    # the policy that played the tables, where they record it; else the run's final checkpoint
    ref = recorded_checkpoint(recorded) if recorded is not None else final
    if recorded is None:
        logger().warning(f"{source}: its tables record no policy (written before tables recorded it, or the record "
                         "is damaged); the report names the run's final checkpoint, "
                         f"{final.path if final else 'none'}, and the configured sampling")
    is_final = (ref.sha256 if ref else None) == (final.sha256 if final else None)
    if not evaluation_dir and not is_final:
        logger().warning(f"{source}: its tables were played by {recorded['checkpoint']}, not by the run's final "
                         f"checkpoint {final.path if final else '(none)'}; the report names the tables' policy")
    start, compared_with = start_for(settings, tables, recorded, source, start_dir, paired=ref is not None)
    target = Path(out_dir) if out_dir else Path(settings.paths.report)
    written = report_on(settings, tables, ref, target, f"{settings.run_name}-report", start, recorded, compared_with)
    if is_final and compared_with is None:
        # the headline numbers where git (and so `dvc exp show`) tracks them: the run's final report's
        io.write_json(settings.paths.metrics, written["metrics"])
    else:
        logger().info(f"{settings.paths.metrics} is left as it was: it holds the run's final checkpoint against its "
                      "starting policy, and this report is of another pair")
    return written


def start_for(settings: Settings, tables: dict[str, FileRef], recorded: dict[str, Any] | None, source: Path,
              start_dir: str | None, paired: bool) -> tuple[dict[str, FileRef], str | None]:
    """The tables to pair ``tables`` with (from ``start_dir``, default the starting policy's),
    checked against them, and the checkpoint they are of when not the starting policy's."""
    start_source = Path(start_dir) if start_dir else evaluation_dir(settings, None)
    start = tables_in(start_source)
    if start_dir and set(start) != set(tables):
        raise FileNotFoundError(f"{start_dir} holds {sorted(start) or 'no'} evaluation tables, the report needs "
                                f"{sorted(tables)}")
    if not paired or set(start) != set(tables):
        if start_dir:
            logger().warning(f"{source} holds the starting policy's own tables: the report pairs them with nothing, "
                             f"and {start_dir} is not used")
        return {}, None
    start_recorded = recorded_policy({split: ref.path for split, ref in start.items()})
    if (recorded is None) != (start_recorded is None):
        logger().warning(f"{source if recorded is None else start_source}: its tables record no policy, so the "
                         "report cannot check that both sides were played at the same sampling")
    if recorded is not None and start_recorded is not None:
        if not same_sampling(recorded, start_recorded):
            raise io.IncompatibleFilesError(
                f"{start_source} was played at sampling {start_recorded['sampling']}, {source} at "
                f"{recorded['sampling']}: a gain paired by initial state compares two policies at one sampling; "
                "evaluate both with the same eval.sampling")
        if same_policy(recorded, start_recorded):
            raise io.IncompatibleFilesError(f"{start_source} and {source} hold tables of one policy, "
                                            f"{recorded['checkpoint'] or 'the starting policy'}: nothing to compare")
    return start, start_recorded["checkpoint"] if start_recorded else None


@flow(name="nightly_evaluation")
def nightly_evaluation(overrides: list[str] | None = None, config_file: str | None = None,
                       run: str | None = None) -> dict[str, Any]:
    """The final checkpoint of run ``run`` (default ``flow.nightly_run``, else the configured
    ``run.name``) against the held-out population; the report is kept per night under
    ``paths.nightly/<date>/<run>``."""
    from prefect.runtime import flow_run

    settings = settings_for(overrides, config_file)
    run = run or settings.flow.nightly_run or settings.run_name
    runs = RunLayout.of(settings).root.parent
    if not run or "/" in run or "\\" in run or run in (".", ".."):
        raise ValueError(f"run must be the plain name of a run under {runs}, got {run!r}")
    ref = checkpoint_ref(settings, None, run)
    if ref is None:
        logger().warning(f"run {run} has no checkpoint under {runs / run}: evaluating the base model")
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(settings.flow.timezone or local_timezone())
    scheduled = flow_run.scheduled_start_time  # the night it was scheduled for, in the schedule's zone
    night = (scheduled or datetime.now(zone)).astimezone(zone).strftime("%Y-%m-%d")
    out_dir = Path(settings.paths.nightly) / night / run
    logger().info(f"nightly evaluation {night} of run {run}: {ref.path if ref else 'the base model'} -> {out_dir}")
    return evaluate_and_report(settings, ref, ("held_out",), out_dir, f"nightly-{night}-{run}")
