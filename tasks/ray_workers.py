"""The Ray side of ``flow.runner=ray``: the rollout worker actor and how a shard task reaches it.

A Prefect task on the Ray runner is a stateless Ray task. Building a generation engine in
it would load the model every iteration, so with ``flow.ray.long_lived_workers`` each
shard's :class:`~mage.run.state.RolloutWorker` lives in a Ray actor that the
train flow creates once per run (``flows/ray_cluster.py``) and kills when it ends. The
shard task finds its actor by name and asks it to play: the actor loads the iteration's
checkpoint by path from the shared storage and writes the shard's table there.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mage.rollout import RolloutStats
from mage.run import steps
from mage.run.state import RolloutWorker
from mage.sections import FlowConfig
from mage.settings import Settings

NAMESPACE = "mage"
#: Set by the runner for every Ray worker: the driver's working directory, where the
#: config's relative paths (``paths.artifacts``) start.
PROJECT_DIR = "MAGE_PROJECT_DIR"


def enter_project_dir() -> None:
    """Ray's ``worker_process_setup_hook`` (the runner sets it): every Ray worker process
    starts in the driver's working directory, so the config's relative paths mean the same
    files. A node without that directory stays where it is, and the cluster check names it."""
    wanted = os.environ.get(PROJECT_DIR)
    if wanted and Path(wanted).is_dir():
        os.chdir(wanted)


def project_dir_problem() -> str | None:
    """Why this worker is not in the driver's working directory (None: it is)."""
    wanted = os.environ.get(PROJECT_DIR)
    if not wanted or (Path(wanted).is_dir() and Path.cwd().samefile(wanted)):
        return None
    return (f"has no {wanted}, the driver's working directory: every node needs the project at the same path "
            "(README, 'Scaling out')")


def actor_name(run_name: str, shard: int) -> str:
    """One actor per shard of a run and driver (the job id keeps two drivers apart)."""
    import ray

    return f"rollout-{run_name}-shard-{shard}-job-{ray.get_runtime_context().get_job_id()}"


class RolloutActor:
    """A Ray actor holding one shard's rollout worker for a whole run."""

    def __init__(self, settings: Settings) -> None:
        self.worker = RolloutWorker(settings)

    def play(self, checkpoint: str | None, iteration: int, shard: int) -> tuple[Path, RolloutStats]:
        return steps.play_shard(self.worker, iteration, checkpoint, shard)

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


def play_on_ray(settings: Settings, checkpoint: str | None, iteration: int, shard: int) -> tuple[Path, RolloutStats]:
    """Play a shard from a Prefect task on the Ray runner: through the run's actor for this
    shard, or (``long_lived_workers: false``) with a worker built for this task alone."""
    import ray

    if settings.flow.ray.long_lived_workers:
        actor = ray.get_actor(actor_name(settings.run_name, shard), namespace=NAMESPACE)
        wait_until_started(actor)
        return ray.get(actor.play.remote(checkpoint, iteration, shard))
    worker = RolloutWorker(settings)
    try:
        return steps.play_shard(worker, iteration, checkpoint, shard)
    finally:
        worker.close()


@contextlib.contextmanager
def shard_options(flow_cfg: FlowConfig) -> Iterator[None]:
    """Ray resources of the shard tasks submitted inside (each builds its engine); other
    runners ignore this. An error a task raises is retried by Prefect, with its log. A task
    whose process or node died took Prefect's task engine with it, so Ray runs it again
    (``max_retries``, the same ``flow.retries``; Ray retries no raised error:
    ``retry_exceptions`` stays off)."""
    if flow_cfg.runner != "ray":
        yield
        return
    from prefect_ray.context import remote_options

    with remote_options(num_cpus=flow_cfg.ray.shard_cpus, num_gpus=flow_cfg.ray.shard_gpus,
                        max_retries=flow_cfg.retries, retry_exceptions=False):
        yield
