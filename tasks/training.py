"""The train flow's steps: :class:`FlowSteps` runs each step of :func:`mage.run.loop.train`
as a Prefect task around the same function of :mod:`mage.run.steps`, so the UI shows every
step of every iteration (state, time, logs) and a transient failure is retried.

Nothing here is cached: the loop resumes a run from its checkpoints (``mage.run.loop``), so a
flow run started again goes on where the last one stopped. Rollout shards go to the flow's
task runner: on threads of this process they sample from the trainer's policy in memory
(as the library's loop does); in other processes (``flow.runner=process``) they load the
iteration's checkpoint. Nothing here knows Ray: on ``flow.runner=ray`` the flow runs
``tasks.ray.steps.RayFlowSteps``, these steps with the shards on the run's Ray actors, the
weights pushed to them and the update on Ray Train's workers (``tasks.ray``, the floor above).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
from prefect import get_run_logger, task
from prefect.task_runners import TaskRunner
from prefect.utilities.annotations import quote

from mage.config.sections import splits_of
from mage.models import checkpoint as ckpt
from mage.rollout import RolloutStats, read_trajectories
from mage.run import steps
from mage.run.loop import Ahead, Steps
from mage.run.state import TrainingState
from mage.settings import Settings
from tasks import worker
from tasks.artifacts import publish_league_table, publish_training_table
from tasks.caching import STEP_DEFAULTS, configured
from tasks.evaluation import evaluate_split
from tasks.model import prepare_model
from tasks.refs import FileRef


@task(name="rollout-shard", task_run_name="rollout-{iteration}-shard-{shard}", **STEP_DEFAULTS)
def rollout_here(state: TrainingState, iteration: int, shard: int) -> tuple[pl.DataFrame, RolloutStats]:
    """Shard ``shard`` of iteration ``iteration``, sampled from the trainer's policy in this process
    (shards on threads take turns on it)."""
    with worker.LOCK:
        return steps.rollout(state.settings, state.backend(), iteration, shard, progress=False,
                             snapshots=state.snapshots)


@task(name="rollout-shard-behind", task_run_name="rollout-{iteration}-shard-{shard}-behind", **STEP_DEFAULTS)
def rollout_behind_here(state: TrainingState, iteration: int, shard: int,
                        policy_version: int) -> tuple[pl.DataFrame, RolloutStats]:
    """Shard ``shard`` of iteration ``iteration``, sampled from the copy of the weights of
    version ``policy_version`` while the update changes the trainer's (``train.max_staleness``:
    :meth:`mage.run.loop.Steps.rollout_behind`)."""
    with worker.BEHIND_LOCK:
        return steps.rollout(state.settings, state.backend_behind(), iteration, shard, progress=False,
                             snapshots=state.snapshots, policy_version=policy_version)


@task(name="rollout-shard", task_run_name="rollout-{iteration}-shard-{shard}", **STEP_DEFAULTS)
def rollout_elsewhere(settings: Settings, checkpoint: str | None, iteration: int, shard: int,
                      weights: str | None = None) -> dict[str, Any]:
    """Shard ``shard`` of iteration ``iteration``, sampled from ``checkpoint`` (None: the starting
    policy; ``weights``: its :func:`~mage.models.checkpoint.weights_id`) by this process's rollout
    worker (on Ray: ``tasks.ray.steps.rollout_on_ray``)."""
    with worker.LOCK:
        path, stats = steps.play_shard(worker.rollout_worker(settings), iteration, checkpoint, shard, weights)
    return {"table": str(path), "stats": stats.__dict__}


@task(name="score-rollout", task_run_name="score-{iteration}", **STEP_DEFAULTS)
def score_rollout(settings: Settings, tables: list[pl.DataFrame], iteration: int) -> pl.DataFrame:
    """The iteration's table with returns and advantages (written under the run)."""
    return steps.score(settings, tables, iteration)


# No retry: a failed update may leave the weights half-updated. The run resumes from its newest checkpoint.
@task(name="update-policy", task_run_name="update-{iteration}", **(STEP_DEFAULTS | {"retries": 0}))
def update_policy(state: TrainingState, table: pl.DataFrame, iteration: int) -> dict[str, float]:
    """One PPO update of the trainer's policy on the scored table."""
    with worker.LOCK:
        return steps.update(state, table, iteration)


@task(name="save-checkpoint", task_run_name="checkpoint-{iteration}", **STEP_DEFAULTS)
def save_checkpoint(state: TrainingState, metrics: dict[str, Any], iteration: int,
                    behind: bool = False) -> ckpt.Checkpoint:
    """Checkpoint the trainer's weights, optimizer and RNG state after ``iteration`` (``behind``:
    its files written while the next rollout plays, :func:`mage.run.loop.writes_behind`)."""
    with worker.LOCK:
        return steps.save(state, metrics, behind)


class FlowSteps(Steps):
    """The steps of :func:`mage.run.loop.train` as Prefect tasks, rollout shards on ``runner``."""

    def __init__(self, settings: Settings, runner: TaskRunner) -> None:
        super().__init__(settings, progress=False)
        self.runner = runner
        self.model: FileRef | None = None

    def _configured(self, step: Any) -> Any:
        return configured(step, self.settings.flow)

    def prepare(self) -> None:
        self.model = self._configured(prepare_model)(self.settings)

    def rollout(self, state: TrainingState, iteration: int) -> tuple[list[pl.DataFrame], list[RolloutStats]]:
        shards = range(self.settings.flow.rollout_shards)
        if not self.settings.flow.remote_rollouts:
            task = self._configured(rollout_here)
            # quoted: Prefect would look through the state for futures while a shard already
            # playing changes its backend's caches (a dict changed during the look fails it)
            futures = [self.runner.submit(task, {"state": quote(state), "iteration": iteration, "shard": s})
                       for s in shards]
            played = [future.result() for future in futures]
            return [table for table, _ in played], [stats for _, stats in played]
        # other processes sample from the newest checkpoint, which with them is written every iteration
        # (behind, where they were pushed its weights: mage.run.loop.writes_behind)
        checkpoint = str(state.checkpoint.path) if state.checkpoint is not None else None
        weights = ckpt.weights_id(state.checkpoint) if state.checkpoint is not None else None
        played = self.play_elsewhere(checkpoint, weights, iteration)
        return [read_trajectories(Path(p["table"])) for p in played], [RolloutStats(**p["stats"]) for p in played]

    def rollout_behind(self, state: TrainingState, iteration: int) -> Ahead:
        state.sync_behind()  # before any shard starts: they all play on the weights as they are now
        task = self._configured(rollout_behind_here)
        futures = [self.runner.submit(task, {"state": quote(state), "iteration": iteration, "shard": s,
                                             "policy_version": state.iteration})
                   for s in range(self.settings.flow.rollout_shards)]

        def wait() -> tuple[list[pl.DataFrame], list[RolloutStats]]:
            # every shard ended before anything is raised: none is left playing on the copy
            outcomes = []
            for future in futures:
                try:
                    outcomes.append((future.result(), None))
                except BaseException as error:  # noqa: BLE001 - raised below, once every shard has ended
                    outcomes.append((None, error))
            failed = [error for _, error in outcomes if error is not None]
            if failed:
                raise failed[0]
            played = [result for result, _ in outcomes]
            return [table for table, _ in played], [stats for _, stats in played]

        return Ahead(wait)

    def play_elsewhere(self, checkpoint: str | None, weights: str | None, iteration: int) -> list[dict[str, Any]]:
        """Every shard of ``iteration`` played from ``checkpoint`` (``weights``: its
        :func:`~mage.models.checkpoint.weights_id`) in the runner's other processes: each
        shard's ``rollout_elsewhere`` result (its table's path and its stats)."""
        task = self._configured(rollout_elsewhere)
        futures = [self.runner.submit(task, {"settings": self.settings, "checkpoint": checkpoint,
                                             "iteration": iteration, "shard": s, "weights": weights})
                   for s in range(self.settings.flow.rollout_shards)]
        return [future.result() for future in futures]

    def score(self, tables: list[pl.DataFrame], iteration: int) -> pl.DataFrame:
        return self._configured(score_rollout)(self.settings, tables, iteration)

    def update(self, state: TrainingState, table: pl.DataFrame, iteration: int) -> dict[str, float]:
        return self._configured(update_policy)(state, table, iteration)

    def save(self, state: TrainingState, metrics: dict[str, Any], behind: bool = False) -> ckpt.Checkpoint:
        return self._configured(save_checkpoint)(state, metrics, state.iteration, behind)

    def evaluate(self, state: TrainingState) -> dict[str, list[dict[str, Any]]]:
        evaluate = self._configured(evaluate_split)
        checkpoint = FileRef.of(state.checkpoint.path, "checkpoint")
        return {split: evaluate(self.settings, self.model, checkpoint, split)["final"]
                for split in splits_of(self.settings.eval.split)}

    @property
    def log(self) -> Any:
        return get_run_logger()  # the flow run's: the UI shows it

    def report(self, record: dict[str, Any], warning: str | None, history: list[dict[str, Any]]) -> None:
        super().report(record, warning, history)
        publish_training_table(self.settings.run_name, history)
        publish_league_table(self.settings.run_name, history)
