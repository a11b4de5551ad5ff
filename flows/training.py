"""Flow ``train``: the run's iterations, as :func:`mage.run.loop.train` runs them, with each
step a Prefect task (``tasks.training.FlowSteps``; on ``flow.runner=ray``
``tasks.ray.steps.RayFlowSteps``) and rollout shards on the flow's task runner. Checkpoints,
evaluations every ``train.eval_every`` iterations, ``metrics.jsonl``, ``final.json``, dvclive
and resume are the loop's: a flow run started again after a crash resumes from the run's
newest checkpoint, and lengthening a run (``train.iterations=...``) keeps the iterations it has.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.task_runners import TaskRunner

from flows.common import logger, settings_for, task_runners
from mage.run import loop
from mage.run.layout import RunLayout
from mage.settings import Settings
from tasks.training import FlowSteps


def flow_steps(settings: Settings, shard_runner: TaskRunner) -> FlowSteps:
    """The run's steps as Prefect tasks, shards submitted to ``shard_runner``; on the Ray runner
    those that play on the run's Ray actors and update on Ray Train's workers."""
    if settings.flow.runner == "ray":
        from tasks.ray.steps import RayFlowSteps

        return RayFlowSteps(settings, shard_runner)
    return FlowSteps(settings, shard_runner)


@flow(name="train")
def train(overrides: list[str] | None = None, config_file: str | None = None) -> dict[str, Any]:
    """Train ``run.name`` for ``train.iterations`` iterations; returns the last checkpoint, the
    last iteration's metrics and the evaluations made on the way."""
    settings = settings_for(overrides, config_file, trains=True)
    flow_cfg = settings.flow
    log = logger()
    log.info(f"run {settings.run_name}: {settings.train.iterations} iterations, {settings.engine.groups} groups x "
             f"{settings.engine.group_size} meta-episodes, {flow_cfg.rollout_shards} rollout shard(s) on a "
             f"{flow_cfg.runner} runner")
    # the run's lock first: a second writer stops before it starts workers or loads a model
    with RunLayout.of(settings).writing(), task_runners(settings, flow_cfg.rollout_shards) as shard_runner:
        result = loop.train(settings, flow_steps(settings, shard_runner))
    checkpoint = result.checkpoint
    if result.resumed_from is not None:
        log.info(f"resumed from {result.resumed_from.path} (iteration {result.resumed_from.iteration})")
    log.info(f"final checkpoint: {checkpoint.path if checkpoint else 'none (0 iterations)'}")
    return {"checkpoint": str(checkpoint.path) if checkpoint else None,
            "metrics": result.history[-1] if result.history else {}, "evaluations": result.evaluations}
