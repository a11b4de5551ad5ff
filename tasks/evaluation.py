"""The tasks of an evaluation: ``evaluate-checkpoint`` and ``write-report``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from prefect import task

from mage import io
from mage.evaluation import write_exploitability
from mage.population import load_manifest
from mage.report import build_report, headline_metrics
from mage.report import write_report as write
from mage.rollout import read_trajectories
from mage.run import steps
from mage.run.record import METRICS_REMEDY
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


@task(name="evaluate-checkpoint", task_run_name="evaluate-{split}", cache_policy=ArtifactCachePolicy(step="evaluate"),
      **TASK_DEFAULTS)
def evaluate_split(
    settings: Settings, model: FileRef, checkpoint: FileRef | None, split: str, out_dir: str | None = None
) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; the table
    and its record go to ``out_dir`` (default: the run's folder for that checkpoint)."""
    model.resolve()
    loaded = ckpt.Checkpoint.at(checkpoint.resolve()) if checkpoint is not None else None
    written = steps.evaluate(settings, loaded, split, out_dir)
    return {"table": FileRef.of(written["table"]), "metrics": FileRef.of(written["metrics"]), "final": written["final"]}


@task(name="measure-exploitability", task_run_name="exploitability", cache_policy=ArtifactCachePolicy(step="exploitability"),
      **TASK_DEFAULTS)
def measure_exploitability(settings: Settings, model: FileRef, checkpoint: FileRef | None, out_dir: str) -> FileRef | None:
    """Kuhn Poker: ``checkpoint``'s (None: the starting policy's) exploitability, written to
    ``out_dir/exploitability.json`` (:func:`mage.evaluation.write_exploitability`); None elsewhere."""
    model.resolve()
    loaded = ckpt.Checkpoint.at(checkpoint.resolve()) if checkpoint is not None else None
    written = write_exploitability(settings, loaded, out_dir)
    return FileRef.of(written) if written is not None else None


def recorded_checkpoint(record: Mapping[str, Any]) -> FileRef | None:
    """The checkpoint a policy record names (not checked against the disk: it only labels)."""
    if record["checkpoint"] is None:
        return None
    return FileRef(path=record["checkpoint"], sha256=record["checkpoint_sha256"], kind="checkpoint")


def start_policy(settings: Settings) -> str:
    """What a run starts from, in words: the tiny warm start (and whom it imitates) or the base model."""
    model = settings.model
    if model.tiny is not None and model.build == "tiny":
        rules = ", ".join(r if isinstance(r, str) else str(r.get("rule")) for r in model.tiny.bc_rules)
        return f"{model.path} (the tiny preset's warm start: behaviour cloning of {rules})"
    return f"{model.local_dir or model.path} (the base model {model.path})"


@task(name="write-report", task_run_name="write-report", cache_policy=ArtifactCachePolicy(step="report"),
      **TASK_DEFAULTS)
def write_report(
    settings: Settings, manifest: FileRef, tables: dict[str, FileRef], checkpoint: FileRef | None, out_dir: str,
    history: FileRef | None = None, start_tables: dict[str, FileRef] | None = None,
    policy: dict[str, Any] | None = None, compared_with: str | None = None,
    exploitability: FileRef | None = None, start_exploitability: FileRef | None = None,
) -> dict[str, Any]:
    """The report of one checkpoint (None: the starting policy) beside the starting policy
    evaluated on the same initial states (``start_tables``): JSON, Markdown and plots in
    ``out_dir``. ``policy``: the tables' own record (:func:`mage.evaluation.recorded_policy`), which names the
    checkpoint, its iteration and the sampling; ``compared_with``: the checkpoint whose tables
    stand in ``start_tables`` instead of the starting policy's. ``exploitability`` and
    ``start_exploitability``: Kuhn Poker's ``exploitability.json`` of either side."""
    if policy is not None:
        checkpoint, iteration, sampling = recorded_checkpoint(policy), policy["iteration"], policy["sampling"]
    else:
        iteration = ckpt.Checkpoint.at(checkpoint.path).iteration if checkpoint is not None else 0
        sampling = dataclasses.asdict(settings.eval.sampling)
    about = {
        "checkpoint": checkpoint.path if checkpoint is not None else f"the starting policy {start_policy(settings)}",
        "checkpoint_sha256": checkpoint.sha256 if checkpoint is not None else None,
        "iteration": iteration,
        "run": settings.run_name,
        "started_from": start_policy(settings),
        "game": settings.game.name,
        "sampling": sampling,
    }
    if compared_with is not None:
        about["compared_with"] = compared_with
    start = {split: read_trajectories(ref.resolve()) for split, ref in (start_tables or {}).items()}
    history_records = io.read_json_lines(history.resolve(), METRICS_REMEDY) if history is not None else []
    report = build_report({split: read_trajectories(ref.resolve()) for split, ref in tables.items()},
                          load_manifest(manifest.resolve()), about, settings.eval.episodes, settings.eval.early_stop,
                          start_tables=start or None, history=history_records,
                          training_temperature=settings.engine.sampling.temperature,
                          exploitability={side: io.read_json(ref.resolve()) for side, ref in
                                          (("policy", exploitability), ("start", start_exploitability))
                                          if ref is not None})
    written = write(report, out_dir, history=history_records)
    return {"directory": out_dir, "files": {k: FileRef.of(v) for k, v in written.items()},
            "metrics": headline_metrics(report)}
