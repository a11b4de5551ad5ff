"""The lifecycle's tasks: thin Prefect wrappers over ``mage`` (see ``tasks.caching``).

Every task takes the composed config as a plain dict (``Settings.raw``) plus file
references, writes its large result under ``paths`` atomically and returns a
:class:`~tasks.refs.FileRef` (with a few numbers beside it where the flow logs them).

=====================  =====================================  ==============================
task                   result                                 cache key (besides code)
=====================  =====================================  ==============================
seed_population        the population manifest                game, population
prepare_model          the base model directory               model
rollout_shard          one shard's trajectory table           game, population, engine, model,
                                                              seed, run; checkpoint; iteration
score_rollout          the iteration's scored table           algo, engine.sampling; shards
train_iteration        the new checkpoint and its metrics     model, algo, train, seed, run;
                                                              table; parent checkpoint
evaluate_checkpoint    evaluation table and metrics           eval, engine, game, population,
                                                              model; checkpoint; split
=====================  =====================================  ==============================
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import polars as pl
from prefect import task

from mage import io
from mage.population import seed_population as build_manifest
from mage.population import write_manifest
from mage.rollout import read_trajectories, write_trajectories
from mage.rollout.metrics import final_episode_metrics, rollout_metrics
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.loop import (
    RunPaths,
    ensure_model,
    iteration_metrics,
    record_metrics,
    rollout_iteration,
    score_iteration,
)
from tasks import state as memory
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef

RUN = ("run", "paths.runs", "seed")


def settings_of(config: dict[str, Any]) -> Settings:
    return Settings.from_config(config)


@task(name="seed-population", task_run_name="seed-population", cache_policy=ArtifactCachePolicy(sections=("game", "population", "paths.population_manifest")),
      **TASK_DEFAULTS)
def seed_population(config: dict[str, Any]) -> FileRef:
    """Write the population manifest (opponents, shares, splits, ceilings)."""
    manifest = build_manifest(config, progress=False)
    return FileRef.of(write_manifest(manifest, config["paths"]["population_manifest"]))


@task(name="prepare-model", task_run_name="prepare-model", cache_policy=ArtifactCachePolicy(sections=("model",)), **TASK_DEFAULTS)
def prepare_model(config: dict[str, Any]) -> FileRef:
    """Build the tiny preset, or fetch a hub model into the local cache; reference its directory."""
    return FileRef.of(ensure_model(settings_of(config), progress=False), "directory")


@task(name="rollout-shard", task_run_name="rollout-{iteration}-shard-{shard}",
      cache_policy=ArtifactCachePolicy(sections=("game", "population", "engine", "model", *RUN)), **TASK_DEFAULTS)
def rollout_shard(
    config: dict[str, Any], model: FileRef, checkpoint: FileRef | None, iteration: int, shard: int = 0, shards: int = 1
) -> dict[str, Any]:
    """Play shard ``shard`` of iteration ``iteration`` with the policy of ``checkpoint``."""
    settings = settings_of(config)
    model.resolve()
    with memory.LOCK:
        state = memory.training_state(settings, checkpoint)
        table, stats = rollout_iteration(settings, state.backend(), iteration, progress=False, shard=shard, shards=shards)
    path = write_trajectories(table, RunPaths.of(settings).rollout_shard(iteration, shard))
    return {"table": FileRef.of(path), "stats": stats.__dict__}


@task(name="score-rollout", task_run_name="score-{iteration}",
      cache_policy=ArtifactCachePolicy(sections=("algo", "engine.sampling", *RUN)), **TASK_DEFAULTS)
def score_rollout(config: dict[str, Any], shards: list[FileRef], iteration: int) -> FileRef:
    """Concatenate an iteration's shards and add returns and advantages."""
    settings = settings_of(config)
    table = pl.concat([read_trajectories(ref.resolve()) for ref in shards])
    scored = score_iteration(settings, table)
    return FileRef.of(write_trajectories(scored, RunPaths.of(settings).rollout(iteration)))


@task(name="train-iteration", task_run_name="update-{iteration}",
      cache_policy=ArtifactCachePolicy(sections=("model", "algo", "train", "engine.sampling", *RUN)), **TASK_DEFAULTS)
def train_iteration(
    config: dict[str, Any], model: FileRef, table: FileRef, checkpoint: FileRef | None, iteration: int
) -> dict[str, Any]:
    """One PPO update from ``checkpoint`` on ``table``; checkpoint the result."""
    settings = settings_of(config)
    model.resolve()
    scored = read_trajectories(table.resolve())
    with memory.LOCK:
        state = memory.training_state(settings, checkpoint)
        try:
            update = state.update(scored, iteration)
            metrics = iteration_metrics(iteration, scored, update)
            saved = state.save(iteration, metrics)
        except BaseException:
            memory.forget()  # the in-memory weights may be half-updated: never reuse them
            raise
    record_metrics(settings, metrics)
    return {"checkpoint": FileRef.of(saved.path, "checkpoint"), "metrics": metrics}


def default_evaluation_dir(settings: Settings, checkpoint: FileRef | None) -> Path:
    name = Path(checkpoint.path).name if checkpoint is not None else "base"
    return Path(settings.paths.get("evaluations", "artifacts/eval")) / settings.run_name / name


@task(name="evaluate-checkpoint", task_run_name="evaluate-{split}",
      cache_policy=ArtifactCachePolicy(sections=("eval", "engine", "game", "population", "model", "run", "paths.evaluations")),
      **TASK_DEFAULTS)
def evaluate_checkpoint(
    config: dict[str, Any], model: FileRef, checkpoint: FileRef | None, split: str, out_dir: str | None = None
) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the base model) against the ``split`` opponents."""
    from mage.evaluation import evaluate
    from mage.train.loop import rollout_backend

    settings = settings_of(config)
    model.resolve()
    loaded = None
    if checkpoint is not None:
        path = checkpoint.resolve()
        loaded = ckpt.Checkpoint.at(path)
    cfg = settings.eval
    backend = rollout_backend(settings, checkpoint=loaded)
    try:
        table = evaluate(settings, backend, dataclasses.replace(cfg, split=split), progress=False,
                         run_id=settings.run_name, iteration=loaded.iteration if loaded else 0)
    finally:
        backend.close()
    directory = Path(out_dir) if out_dir else default_evaluation_dir(settings, checkpoint)
    table_ref = FileRef.of(write_trajectories(table, directory / f"{split}.parquet"))
    per_episode = rollout_metrics(table)
    final = final_episode_metrics(table)
    metrics = {"per_episode": per_episode.to_dicts(), "final": final.to_dicts()}
    metrics_ref = FileRef.of(io.write_json(directory / f"{split}-metrics.json", metrics))
    return {"table": table_ref, "metrics": metrics_ref, "final": final.to_dicts()}


@task(name="write-report", task_run_name="write-report", cache_policy=ArtifactCachePolicy(sections=("run", "eval", "game", "model")), **TASK_DEFAULTS)
def write_report(
    config: dict[str, Any], manifest: FileRef, tables: dict[str, FileRef], checkpoint: FileRef | None, out_dir: str,
    history: FileRef | None = None,
) -> dict[str, Any]:
    """The generalisation report of one checkpoint: JSON, Markdown and plots in ``out_dir``."""
    import json

    from mage.population import load_manifest
    from mage.report import build_report, headline_metrics
    from mage.report import write_report as write

    settings = settings_of(config)
    about = {
        "checkpoint": checkpoint.path if checkpoint is not None else f"base model {settings.model.path}",
        "checkpoint_sha256": checkpoint.sha256 if checkpoint is not None else None,
        "run": settings.run_name,
        "game": settings.game["name"],
        "episodes": settings.eval.episodes,
        "sampling": {k: getattr(settings.eval.sampling, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")},
    }
    report = build_report({split: read_trajectories(ref.resolve()) for split, ref in tables.items()},
                          load_manifest(manifest.resolve()), about)
    lines = history.resolve().read_text().splitlines() if history is not None else []
    written = write(report, out_dir, history=[json.loads(line) for line in lines if line.strip()])
    return {"directory": out_dir, "files": {k: FileRef.of(v) for k, v in written.items()},
            "metrics": headline_metrics(report)}
