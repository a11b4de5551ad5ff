"""The tasks of an evaluation: ``evaluate-checkpoint`` and ``write-report``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import task

from mage import io
from mage.rollout import read_trajectories, write_trajectories
from mage.rollout.metrics import final_episode_metrics, rollout_metrics
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


def default_evaluation_dir(settings: Settings, checkpoint: FileRef | None) -> Path:
    """``paths.evaluations/<run>/<checkpoint>``, or ``paths.start_evaluation`` for the starting policy."""
    if checkpoint is None:
        return Path(settings.paths.start_evaluation)
    return Path(settings.paths.evaluations) / settings.run_name / Path(checkpoint.path).name


def sampling_of(settings: Settings) -> dict[str, Any]:
    """The evaluation's sampling (every field), as reports show it and tables record it."""
    return dataclasses.asdict(settings.eval.sampling)


RECORD_KEYS = frozenset({"checkpoint", "checkpoint_sha256", "iteration", "sampling"})


def policy_record(settings: Settings, checkpoint: FileRef | None, iteration: int) -> dict[str, Any]:
    """What played an evaluation table, kept beside it in ``{split}-metrics.json``: a report
    made later from the table alone (``python -m flows report --evaluation-dir``) names this
    checkpoint and sampling, not the run's final checkpoint or the sampling configured then."""
    return {"checkpoint": checkpoint.path if checkpoint is not None else None,
            "checkpoint_sha256": checkpoint.sha256 if checkpoint is not None else None,
            "iteration": iteration, "sampling": sampling_of(settings)}


def _text(value: Any) -> bool:
    """A string that can be written out (JSON's escapes can read in a lone surrogate)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_policy_record(value: Any) -> bool:
    """Whether ``value`` (read from a file) is a whole :func:`policy_record`."""
    if not (isinstance(value, dict) and RECORD_KEYS <= value.keys()):
        return False
    named = value["checkpoint"], value["checkpoint_sha256"]
    sampling = value["sampling"]
    return (all(_text(v) and v for v in named) or named == (None, None)) \
        and type(value["iteration"]) is int and value["iteration"] >= 0 and isinstance(sampling, dict) \
        and all(_text(k) for k in sampling) \
        and all(v is None or isinstance(v, (bool, int, float)) or _text(v)
                or (isinstance(v, list) and all(_text(x) for x in v)) for v in sampling.values())


def same_policy(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two records name one policy at one sampling: by content hash, not path (one
    checkpoint may be named ``./artifacts/...`` in one record and absolutely in another)."""
    return (a["checkpoint_sha256"], a["iteration"]) == (b["checkpoint_sha256"], b["iteration"]) \
        and same_sampling(a, b)


def same_sampling(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return json.dumps(a["sampling"], sort_keys=True) == json.dumps(b["sampling"], sort_keys=True)


def recorded_policy(tables: Mapping[str, FileRef]) -> dict[str, Any] | None:
    """The policy that played ``tables``, from the ``{split}-metrics.json`` beside each; None
    when any table lacks a whole record (written before tables recorded it, or damaged).
    Tables of different policies or sampling are refused: one report cannot be about both."""
    records = {}
    for split, table in tables.items():
        path = Path(table.path).parent / f"{split}-metrics.json"
        try:  # whatever the file holds: a record, or none
            record = io.read_json(path).get("policy") if path.is_file() else None
        except (ValueError, RecursionError, OSError, AttributeError):  # CorruptFileError is a ValueError
            record = None
        if not is_policy_record(record):
            return None
        records[path] = record
    first = next(iter(records.values()), None)
    if any(not same_policy(first, record) for record in records.values()):
        raise io.IncompatibleFilesError(
            "these evaluation tables were played by different policies or at different sampling, and one report "
            "cannot be about all of them: " + "; ".join(f"{path}: {record}" for path, record in records.items()))
    return first


def recorded_checkpoint(record: Mapping[str, Any]) -> FileRef | None:
    """The checkpoint a :func:`policy_record` names (not checked against the disk: it only labels)."""
    if record["checkpoint"] is None:
        return None
    return FileRef(path=record["checkpoint"], sha256=record["checkpoint_sha256"], kind="checkpoint")


@task(name="evaluate-checkpoint", task_run_name="evaluate-{split}",
      cache_policy=ArtifactCachePolicy(sections=("eval", "engine", "game", "population", "model", "run", "paths.evaluations")),
      **TASK_DEFAULTS)
def evaluate_checkpoint(
    config: dict[str, Any], model: FileRef, checkpoint: FileRef | None, split: str, out_dir: str | None = None
) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy, the base model) against the ``split`` opponents."""
    from mage import evaluation

    settings = Settings.from_config(config)
    model.resolve()
    loaded = ckpt.Checkpoint.at(checkpoint.resolve()) if checkpoint is not None else None
    table = evaluation.evaluate_checkpoint(settings, loaded, (split,), progress=True)[split]
    directory = Path(out_dir) if out_dir else default_evaluation_dir(settings, checkpoint)
    table_ref = FileRef.of(write_trajectories(table, directory / f"{split}.parquet"))
    per_episode = rollout_metrics(table)
    final = final_episode_metrics(table)
    metrics = {"policy": policy_record(settings, checkpoint, loaded.iteration if loaded is not None else 0),
               "per_episode": per_episode.to_dicts(), "final": final.to_dicts()}
    metrics_ref = FileRef.of(io.write_json(directory / f"{split}-metrics.json", metrics))
    return {"table": table_ref, "metrics": metrics_ref, "final": final.to_dicts()}


def start_policy(settings: Settings) -> str:
    """What a run starts from, in words: the tiny warm start (and whom it imitates) or the base model."""
    model = settings.model
    if model.tiny is not None and model.build == "tiny":
        rules = ", ".join(r if isinstance(r, str) else str(r.get("rule")) for r in model.tiny.bc_rules)
        return f"{model.path} (the tiny preset's warm start: behaviour cloning of {rules})"
    return f"{model.local_dir or model.path} (the base model {model.path})"


@task(name="write-report", task_run_name="write-report",
      cache_policy=ArtifactCachePolicy(sections=("run", "eval", "game", "model")), **TASK_DEFAULTS)
def write_report(
    config: dict[str, Any], manifest: FileRef, tables: dict[str, FileRef], checkpoint: FileRef | None, out_dir: str,
    history: FileRef | None = None, start_tables: dict[str, FileRef] | None = None,
    policy: dict[str, Any] | None = None, compared_with: str | None = None,
) -> dict[str, Any]:
    """The report of one checkpoint (None: the starting policy) beside the starting policy
    evaluated on the same initial states (``start_tables``): JSON, Markdown and plots in
    ``out_dir``. ``policy``: the tables' own record (:func:`recorded_policy`), which names the
    checkpoint, its iteration and the sampling; ``compared_with``: the checkpoint whose tables
    stand in ``start_tables`` instead of the starting policy's."""
    from mage.population import load_manifest
    from mage.train.loop import METRICS_REMEDY
    from mage.report import build_report, headline_metrics
    from mage.report import write_report as write

    settings = Settings.from_config(config)
    if policy is not None:
        checkpoint, iteration, sampling = recorded_checkpoint(policy), policy["iteration"], policy["sampling"]
    else:
        iteration = ckpt.Checkpoint.at(checkpoint.path).iteration if checkpoint is not None else 0
        sampling = sampling_of(settings)
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
    report = build_report({split: read_trajectories(ref.resolve()) for split, ref in tables.items()},
                          load_manifest(manifest.resolve()), about, settings.eval.episodes, settings.eval.early_stop,
                          start_tables=start or None)
    history_records = io.read_json_lines(history.resolve(), METRICS_REMEDY) if history is not None else []
    written = write(report, out_dir, history=history_records)
    return {"directory": out_dir, "files": {k: FileRef.of(v) for k, v in written.items()},
            "metrics": headline_metrics(report)}
