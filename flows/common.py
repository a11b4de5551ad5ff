"""What every flow shares: settings from overrides, the task runner, logging."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from prefect import get_run_logger
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from mage import stopping
from mage.config.sections import FlowSection
from mage.preflight.memory_plan import check_fits
from mage.preflight.paths import check_paths
from mage.settings import Settings, load_settings

#: The flows that train: they check the memory plan of an update beside its engine.
TRAINING_FLOWS = ("train", "pipeline")


def settings_for(overrides: Sequence[str] | None, config_file: str | None, trains: bool = False) -> Settings:
    """Compose and validate before any work: a wrong key fails the flow run at once, and so do
    paths that cannot be written or loaded (:func:`mage.preflight.paths.check_paths`) and, for a
    flow that ``trains``, a configuration whose memory plan cannot fit its GPU
    (:func:`mage.preflight.memory_plan.check_fits`)."""
    settings = load_settings(list(overrides or []), config_file)
    check_paths(settings)
    if trains:
        check_fits(settings)
    return settings


def local_timezone() -> str:
    """This machine's time zone (the nightly schedule's default)."""
    import tzlocal

    return tzlocal.get_localzone_name() or "UTC"


def make_runner(flow_cfg: FlowSection) -> TaskRunner:
    """The task runner that fans rollout shards out (``flow.runner``)."""
    if flow_cfg.runner == "ray":
        from tasks.ray.cluster import ray_runner

        return ray_runner(flow_cfg)
    if flow_cfg.runner == "process":
        return ProcessPoolTaskRunner(max_workers=flow_cfg.max_workers)
    if flow_cfg.runner == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    return ThreadPoolTaskRunner(max_workers=flow_cfg.max_workers)


@contextlib.contextmanager
def shard_workers(settings: Settings, runner: TaskRunner, shards: int) -> Iterator[TaskRunner]:
    """Inside a started ``runner``: the runner to submit rollout shards to. On Ray the cluster
    is checked first, and with long-lived workers the run's actors are held until the block
    ends; a shard task then only hands its shard to its actor and waits, so it runs on a
    thread of this process (a Ray task would start a Ray worker process for that wait)."""
    if settings.flow.runner != "ray":
        yield runner
        return
    from tasks.ray.cluster import on_ray

    with on_ray(settings, shards) as actors:
        if not actors:
            yield runner
            return
        with ThreadPoolTaskRunner(max_workers=len(actors)) as dispatcher:
            yield dispatcher


@contextlib.contextmanager
def task_runners(settings: Settings, shards: int) -> Iterator[TaskRunner]:
    """The flow's task runner (``flow.runner``), started, and inside it the runner to submit
    shards to (:func:`shard_workers`). If the block fails or is stopped (a stop signal reaches
    only the main thread), the tasks still running on the runners' threads are asked to end at
    their next step (:mod:`mage.stopping`) before the runners wait for them: the flow then
    records its final state within seconds, not when the last shard is played."""
    try:
        with make_runner(settings.flow) as runner, shard_workers(settings, runner, shards) as shard_runner:
            try:
                yield shard_runner
            except BaseException:
                stopping.request()
                raise
    finally:
        stopping.clear()


def logger():
    return get_run_logger()
