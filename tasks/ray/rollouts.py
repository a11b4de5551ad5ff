"""The rollouts of ``flow.runner=ray``: the rollout worker actor and how a shard task reaches it.

A Prefect task on the Ray runner is a stateless Ray task. Building a generation engine in
it would load the model every iteration, so with ``flow.ray.long_lived_workers`` each
shard's :class:`~mage.run.worker.RolloutWorker` lives in a Ray actor that the
train flow creates once per run (``tasks.ray.cluster``) and kills when it ends. The
shard task finds its actor by name and asks it to play: the actor samples from the weights the
trainer pushed it after the update (:func:`push_weights`, full fine-tuning), or loads the
iteration's checkpoint by path from the shared storage, and writes the shard's table there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mage import stopping
from mage.backends import weight_sync
from mage.config.sections import FlowSection
from mage.models import checkpoint as ckpt
from mage.rollout import RolloutStats
from mage.run import RunLayout, steps
from mage.run.state import TrainingState, probe_logprobs
from mage.run.worker import RolloutWorker
from mage.settings import Settings
from tasks.ray.setup import NAMESPACE

logger = logging.getLogger(__name__)

def actor_name(run_name: str, shard: int) -> str:
    """One actor per shard of a run and driver (the job id keeps two drivers apart)."""
    import ray

    return f"rollout-{run_name}-shard-{shard}-job-{ray.get_runtime_context().get_job_id()}"


class RolloutActor:
    """A Ray actor holding one shard's rollout worker for a whole run."""

    def __init__(self, settings: Settings) -> None:
        self.worker = RolloutWorker(settings)

    def play(self, checkpoint: str | None, iteration: int, shard: int,
             weights: str | None = None) -> tuple[Path, RolloutStats]:
        return steps.play_shard(self.worker, iteration, checkpoint, shard, weights)

    def take_weights(self, checkpoint: str, weights: str, chunks: list[Any], probe: weight_sync.Probe,
                     expected: list[list[float]]) -> dict[str, Any]:
        """:meth:`RolloutWorker.take_weights`, its chunks fetched from Ray's object store one by one."""
        import ray

        return self.worker.take_weights(checkpoint, weights, (ray.get(ref) for ref in chunks), probe, expected)

    def pid(self) -> int:
        return os.getpid()


class RolloutWorkerGone(RuntimeError):
    """A shard's worker actor is dead for good (its ``flow.ray.worker_restarts`` are spent)."""

    transient = False  # tasks.caching.is_transient: another try would find it dead again


#: How long a retried shard waits for its worker actor to start again (a model load; minutes for a large vLLM engine)
RESTART_WAIT_SECONDS = 900.0


def wait_until_started(actor: Any, timeout: float = RESTART_WAIT_SECONDS) -> None:
    """Return once ``actor`` answers. A worker that died is started again by Ray (up to
    ``flow.ray.worker_restarts``), and calls fail while it restarts: the retried shard waits.
    One that can no longer start raises :class:`RolloutWorkerGone` at once."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return
        except ray.exceptions.GetTimeoutError as error:
            raise TimeoutError(f"the rollout worker actor did not start within {timeout:g} s") from error
        except ray.exceptions.ActorDiedError as error:
            # Ray says "unavailable" while an actor restarts, and "died" once it is dead for good,
            # except for a preempted node (an autoscaler drain), whose actors restart elsewhere.
            if getattr(error, "preempted", False) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            why = ("its constructor failed" if getattr(error, "actor_init_failed", False)
                   else "its flow.ray.worker_restarts are spent")
            raise RolloutWorkerGone(f"the rollout worker actor is dead and will not start again ({why}): "
                                    f"{error}") from error
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def play_on_ray(settings: Settings, checkpoint: str | None, iteration: int, shard: int,
                weights: str | None = None) -> tuple[Path, RolloutStats]:
    """Play a shard from a Prefect task on the Ray runner: through the run's actor for this
    shard, or (``long_lived_workers: false``) with a worker built for this task alone."""
    import ray

    if settings.flow.ray.long_lived_workers:
        actor = ray.get_actor(actor_name(settings.run_name, shard), namespace=NAMESPACE)
        wait_until_started(actor)
        played = actor.play.remote(checkpoint, iteration, shard, weights)
        while not ray.wait([played], timeout=1.0)[0]:
            stopping.check()  # this thread waits for the actor: the flow's stop reaches it only so
        return ray.get(played)
    worker = RolloutWorker(settings)
    try:
        return steps.play_shard(worker, iteration, checkpoint, shard, weights)
    finally:
        worker.close()


def push_weights(state: TrainingState, checkpoint: ckpt.Checkpoint) -> list[dict[str, Any]]:
    """The trainer's weights (those of ``checkpoint``, named by its
    :func:`~mage.models.checkpoint.weights_id`: its files may still be being written behind) to
    every rollout worker actor of the run, through Ray's object store, each checked on the
    iteration's probe against the trainer's log-probs: a worker that serves other weights stops
    the run (``StaleWeightsError``). A worker that is restarting, or dead, is skipped: it reads
    the checkpoint when next asked to play (waiting for its files if need be). Returns each worker's result (its largest gap and seconds; {} if it took nothing)."""
    import ray

    settings = state.settings
    probe = state.probe(RunLayout.of(settings).rollout(state.iteration))  # read once: the probe is fixed
    expected = probe_logprobs(state.policy, probe)
    chunks = [ray.put(chunk) for chunk in weight_sync.encoded(state.policy.model.state_dict().items())]
    path, weights = str(checkpoint.path), ckpt.weights_id(checkpoint)
    calls = []
    for shard in range(settings.flow.rollout_shards):
        actor = ray.get_actor(actor_name(settings.run_name, shard), namespace=NAMESPACE)
        calls.append(actor.take_weights.remote(path, weights, chunks, probe, expected))
    results = []
    for shard, call in enumerate(calls):
        try:
            results.append(ray.get(call))
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as error:
            logger.warning(f"rollout worker of shard {shard} took no weights (it reads {path} instead): {error}")
            results.append({})
    return results


@contextlib.contextmanager
def shard_options(flow_cfg: FlowSection) -> Iterator[None]:
    """Ray resources of the shard tasks submitted inside (each builds its engine), for a flow
    on the Ray runner (the other runners have no use for them). An error a task raises is
    retried by Prefect, with its log. A task whose process or node died took Prefect's task
    engine with it, so Ray runs it again (``max_retries``, the same ``flow.retries``; Ray
    retries no raised error: ``retry_exceptions`` stays off)."""
    from prefect_ray.context import remote_options

    with remote_options(num_cpus=flow_cfg.ray.shard_cpus, num_gpus=flow_cfg.ray.shard_gpus,
                        max_retries=flow_cfg.retries, retry_exceptions=False):
        yield
