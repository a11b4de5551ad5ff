"""The tasks of a training iteration: ``rollout-shard``, ``score-rollout`` and ``train-iteration``."""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import task

from mage.rollout import read_trajectories, write_trajectories
from mage.settings import Settings
from mage.train.loop import RunPaths, iteration_metrics, score_iteration
from tasks import state as memory
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef

RUN = ("run", "paths.runs", "seed")


@task(name="rollout-shard", task_run_name="rollout-{iteration}-shard-{shard}",
      cache_policy=ArtifactCachePolicy(sections=("game", "population", "engine", "model", *RUN)), **TASK_DEFAULTS)
def rollout_shard(
    config: dict[str, Any], model: FileRef, checkpoint: FileRef | None, iteration: int, shard: int = 0, shards: int = 1
) -> dict[str, Any]:
    """Play shard ``shard`` of iteration ``iteration`` with the policy of ``checkpoint``."""
    settings = Settings.from_config(config)
    model.resolve()
    policy = str(checkpoint.resolve()) if checkpoint else None
    if settings.flow.runner == "ray":
        from tasks.ray_workers import play_on_ray

        path, stats = play_on_ray(settings, policy, iteration, shard, shards)
    else:
        with memory.LOCK:
            path, stats = memory.rollout_worker(settings).play_shard(iteration, policy, shard, shards)
    return {"table": FileRef.of(path), "stats": stats.__dict__}


@task(name="score-rollout", task_run_name="score-{iteration}",
      cache_policy=ArtifactCachePolicy(sections=("algo", "engine.sampling", *RUN)), **TASK_DEFAULTS)
def score_rollout(config: dict[str, Any], shards: list[FileRef], iteration: int) -> FileRef:
    """Concatenate an iteration's shards and add returns and advantages."""
    settings = Settings.from_config(config)
    table = pl.concat([read_trajectories(ref.resolve()) for ref in shards])
    scored = score_iteration(settings, table)
    return FileRef.of(write_trajectories(scored, RunPaths.of(settings).rollout(iteration)))


@task(name="train-iteration", task_run_name="update-{iteration}",
      cache_policy=ArtifactCachePolicy(sections=("model", "algo", "train", "engine.sampling", *RUN)), **TASK_DEFAULTS)
def train_iteration(
    config: dict[str, Any], model: FileRef, table: FileRef, checkpoint: FileRef | None, iteration: int
) -> dict[str, Any]:
    """One PPO update from ``checkpoint`` on ``table``; checkpoint the result."""
    settings = Settings.from_config(config)
    model.resolve()
    scored = read_trajectories(table.resolve())
    with memory.LOCK:
        state = memory.training_state(settings, checkpoint)
        try:
            with memory.engine_asleep():
                update = state.update(scored, iteration)
            metrics = iteration_metrics(iteration, scored, update)
            saved = state.save(iteration, metrics)
        except BaseException:
            memory.forget_training_state()  # the in-memory weights may be half-updated: never reuse them
            raise
    return {"checkpoint": FileRef.of(saved.path, "checkpoint"), "metrics": metrics}
