"""The train flow's steps on ``flow.runner=ray``: :class:`RayFlowSteps` is
:class:`tasks.training.FlowSteps` with what Ray changes, and the flow runs it when
``flow.runner`` is ``ray`` (``flows.training``).

* Rollout shards are played by the run's rollout worker actors (or, without
  ``flow.ray.long_lived_workers``, by a worker built in the shard's Ray task), submitted with
  the shard tasks' Ray resources (:func:`tasks.ray.rollouts.shard_options`).
* After each checkpoint the trainer's weights go to the actors through memory, where
  :func:`mage.run.loop.pushes_weights` says so (task ``push-weights``).
* With ``train.workers`` > 1 the update runs on Ray Train's workers
  (``update-policy-on-workers``, :mod:`tasks.ray.update`).

Everything else, and the results, are :class:`~tasks.training.FlowSteps`'. A task keeps the
name of the step it stands for (``rollout-shard``), so a run's steps read alike on every runner.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import get_run_logger, task

from mage.models import checkpoint as ckpt
from mage.run.loop import pushes_weights
from mage.run.state import TrainingState
from mage.settings import Settings
from tasks import worker
from tasks.caching import STEP_DEFAULTS
from tasks.ray.rollouts import play_on_ray, push_weights, shard_options
from tasks.ray.update import update_policy_on_workers
from tasks.training import FlowSteps


@task(name="rollout-shard", task_run_name="rollout-{iteration}-shard-{shard}", **STEP_DEFAULTS)
def rollout_on_ray(settings: Settings, checkpoint: str | None, iteration: int, shard: int,
                   weights: str | None = None) -> dict[str, Any]:
    """Shard ``shard`` of iteration ``iteration``, sampled from ``checkpoint`` (None: the starting
    policy; ``weights``: its :func:`~mage.models.checkpoint.weights_id`) by the run's worker actor
    for the shard, or by a worker built for this task alone (:func:`~tasks.ray.rollouts.play_on_ray`)."""
    path, stats = play_on_ray(settings, checkpoint, iteration, shard, weights)
    return {"table": str(path), "stats": stats.__dict__}


@task(name="push-weights", task_run_name="push-weights-{iteration}", **STEP_DEFAULTS)
def push_weights_to_workers(state: TrainingState, checkpoint: ckpt.Checkpoint, iteration: int) -> list[dict[str, Any]]:
    """The update's weights to the run's rollout worker actors through memory, checked."""
    with worker.LOCK:
        pushed = push_weights(state, checkpoint)
    taken = [p for p in pushed if p]
    if taken:
        get_run_logger().info(f"weights of update {iteration} to {len(taken)} of {len(pushed)} rollout workers through "
                              f"memory in {max(p['seconds'] for p in taken):.2f} s, probe log-probs within "
                              f"{max(p['gap'] for p in taken):.1e} of the trainer's")
    return pushed


class RayFlowSteps(FlowSteps):
    """:class:`~tasks.training.FlowSteps` on the Ray runner: shards on the run's actors, weights
    pushed to them, the update on Ray Train's workers where ``train.workers`` > 1."""

    def play_elsewhere(self, checkpoint: str | None, weights: str | None, iteration: int) -> list[dict[str, Any]]:
        task = self._configured(rollout_on_ray)
        with shard_options(self.settings.flow):
            futures = [self.runner.submit(task, {"settings": self.settings, "checkpoint": checkpoint,
                                                 "iteration": iteration, "shard": s, "weights": weights})
                       for s in range(self.settings.flow.rollout_shards)]
        return [future.result() for future in futures]

    def update(self, state: TrainingState, table: pl.DataFrame, iteration: int) -> dict[str, float]:
        if self.settings.train.workers > 1:  # on Ray Train's workers, from the table score_rollout wrote
            return self._configured(update_policy_on_workers)(state, iteration)
        return super().update(state, table, iteration)

    def save(self, state: TrainingState, metrics: dict[str, Any], behind: bool = False) -> ckpt.Checkpoint:
        saved = super().save(state, metrics, behind)
        # the rollout workers take the new weights from memory; the checkpoint is for resume (the last one: nothing plays)
        if pushes_weights(self.settings) and state.iteration < self.settings.train.iterations:
            self._configured(push_weights_to_workers)(state, saved, state.iteration)
        return saved
