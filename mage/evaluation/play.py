"""Evaluation: a policy against an opponent set, per opponent and per episode k.

An evaluation plays ``meta_episodes`` per split, shared equally by the split's opponents in
whole groups (half seated second, where the game has two seats), so the pooled rate of a
split has a known precision (384 meta-episodes: a 95% half-width of at most 0.05) whatever
the number of opponents. Initial states are drawn from the evaluation seed only, so two
checkpoints are evaluated on the same deals, boards and levels (a paired comparison). Sampling uses the evaluation settings
(docs/method.md, The policy update: temperature 0.7, top-p 0.8, top-k 20) and may play more episodes
than training (``episodes``). The result is an ordinary trajectory table; metrics come
from ``mage.rollout.metrics``.

:func:`write_evaluation` is the lifecycle's evaluation step: one split's table written with
``{split}-metrics.json`` beside it, whose ``policy`` record (:func:`policy_record`) names
what played it, so a report made later from the tables alone names the right policy.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from mage import io
from mage.backends import Backend
from mage.config.sections import SPLITS, EvalSection, PopulationEntry, RolloutSection
from mage.models.checkpoint import Checkpoint, content_hash, held
from mage.models.policy import rollout_backend
from mage.rollout import RolloutEngine, plan_meta_episodes, write_trajectories
from mage.rollout.metrics import final_episode_metrics, rollout_metrics
from mage.settings import Settings
from mage.tensors import derive_seed


def opponents_for(settings: Settings, split: str) -> list[PopulationEntry]:
    entries = settings.population.entries
    return list(entries) if split == "all" else [e for e in entries if e.split == split]


def evaluate(
    settings: Settings,
    backend: Backend,
    cfg: EvalSection,
    entries: list[PopulationEntry] | None = None,
    run_id: str = "eval",
    iteration: int = 0,
    progress: bool = True,
    rollout: RolloutSection | None = None,
) -> pl.DataFrame:
    """Play every opponent of ``entries`` (default: ``cfg.split``) and return the table;
    meta-episodes are played as ``rollout`` (default: ``engine``'s settings) with the
    evaluation's episodes, group size and early stop."""
    entries = entries if entries is not None else opponents_for(settings, cfg.split)
    seat_split, num_seats = settings.population.seat_split, settings.game.num_players
    groups = cfg.groups_per_opponent(len(entries))
    specs = []
    for index, entry in enumerate(entries):
        planned = plan_meta_episodes(
            [entry], groups, cfg.group_size, derive_seed(cfg.seed, zlib.crc32(entry.id.encode())), seat_split, num_seats
        )  # an opponent's initial states depend on its id, not on what else is evaluated
        offset_meta, offset_group = len(specs), index * groups
        specs += [replace(s, meta_id=s.meta_id + offset_meta, group_id=s.group_id + offset_group) for s in planned]
    played = rollout if rollout is not None else settings.engine
    rollout = RolloutSection(episodes=cfg.episodes, group_size=cfg.group_size, early_stop=cfg.early_stop,
                            context_mode=played.context_mode, same_initial_state=played.same_initial_state,
                            max_prompt_tokens=played.max_prompt_tokens, prompt_overflow=played.prompt_overflow,
                            concurrency=played.concurrency)
    engine = RolloutEngine(backend, rollout, settings.game.params)
    sampling = replace(cfg.sampling, seed=derive_seed(cfg.seed, 99))
    # a checkpoint's tables are numbered by its iteration, the updates its weights had seen
    return engine.run(specs, sampling, run_id=run_id, iteration=iteration, progress=progress, policy_version=iteration)


def evaluate_checkpoint(
    settings: Settings,
    checkpoint: Checkpoint | None = None,
    splits: Sequence[str] = SPLITS,
    cfg: EvalSection | None = None,
    progress: bool = False,
) -> dict[str, pl.DataFrame]:
    """Play ``checkpoint`` (None: the run's starting weights) against each split's opponents
    with ``cfg`` (default: ``settings.eval``; its ``split`` is each of ``splits``): one table
    per split. The policy is loaded once for all splits and its backend released after."""
    cfg = cfg if cfg is not None else settings.eval
    backend = rollout_backend(settings, checkpoint=checkpoint)
    try:
        iteration = checkpoint.iteration if checkpoint is not None else 0
        return {split: evaluate(settings, backend, replace(cfg, split=split), run_id=settings.run_name,
                                iteration=iteration, progress=progress) for split in splits}
    finally:
        backend.release()  # vllm: the process's engine stays for the next evaluation


# -- the evaluation step: a table and the record of what played it --------------------------
RECORD_KEYS = frozenset({"checkpoint", "checkpoint_sha256", "iteration", "sampling"})


def policy_record(settings: Settings, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """What played an evaluation table, kept beside it in ``{split}-metrics.json``: a report
    made later from the table alone (``python -m flows report --evaluation-dir``) names this
    checkpoint and sampling, not the run's final checkpoint or the sampling configured then."""
    return {"checkpoint": str(checkpoint.path) if checkpoint is not None else None,
            "checkpoint_sha256": content_hash(checkpoint.path) if checkpoint is not None else None,
            "iteration": checkpoint.iteration if checkpoint is not None else 0,
            "sampling": dataclasses.asdict(settings.eval.sampling)}


def write_evaluation(settings: Settings, checkpoint: Checkpoint | None, split: str, out_dir: str | Path,
                     progress: bool = True) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; write
    ``{split}.parquet`` and ``{split}-metrics.json`` (the policy record, per-episode and final
    metrics) into ``out_dir``. Returns their paths and the final-episode rows. The checkpoint
    is held while it plays: a run that is still training does not prune it."""
    with held(checkpoint.path if checkpoint is not None else None):
        table = evaluate_checkpoint(settings, checkpoint, (split,), progress=progress)[split]
    directory = Path(out_dir)
    table_path = write_trajectories(table, directory / f"{split}.parquet")
    final = final_episode_metrics(table).to_dicts()
    metrics = {"policy": policy_record(settings, checkpoint), "per_episode": rollout_metrics(table).to_dicts(),
               "final": final}
    metrics_path = io.write_json(directory / f"{split}-metrics.json", metrics)
    return {"table": table_path, "metrics": metrics_path, "final": final}


EXPLOITABILITY_FILE = "exploitability.json"


def write_exploitability(settings: Settings, checkpoint: Checkpoint | None, out_dir: str | Path) -> Path | None:
    """A game whose exploitability is measured (Kuhn Poker, or an OpenSpiel game that fits:
    :func:`mage.evaluation.exploitability.measured`), played by a model: ``exploitability.json`` in
    ``out_dir``, the exploitability of ``checkpoint`` (None: the starting policy;
    :func:`mage.evaluation.exploitability.of_run_policy`) with its policy record; None (nothing
    written) for other games and the scripted backend."""
    from mage.evaluation import exploitability

    if not exploitability.measured(settings):
        return None
    with held(checkpoint.path if checkpoint is not None else None):
        backend = rollout_backend(settings, checkpoint=checkpoint)
        try:
            found = exploitability.of_run_policy(settings, exploitability.scorer(backend))
        finally:
            backend.release()
    record = {"checkpoint": str(checkpoint.path) if checkpoint is not None else None,
              "checkpoint_sha256": content_hash(checkpoint.path) if checkpoint is not None else None,
              "iteration": checkpoint.iteration if checkpoint is not None else 0}
    return io.write_json(Path(out_dir) / EXPLOITABILITY_FILE, {"policy": record} | found)


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


def recorded_policy(tables: Mapping[str, str | Path]) -> dict[str, Any] | None:
    """The policy that played ``tables`` (split -> table path), from the
    ``{split}-metrics.json`` beside each; None when any table lacks a whole record (written
    before tables recorded it, or damaged). Tables of different policies or sampling are
    refused: one report cannot be about both."""
    records = {}
    for split, table in tables.items():
        path = Path(table).parent / f"{split}-metrics.json"
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
