"""The update on ``train.workers`` Ray Train workers (``train.workers`` > 1, ``flow.runner=ray``;
``tasks.ray.steps.RayFlowSteps`` runs it as the iteration's update step).

Each try of an iteration's update is one ``ray.train.torch.TorchTrainer`` run: N workers, each
with ``train.worker_cpus`` CPUs and ``train.worker_gpus`` GPUs, joined in one process group
(NCCL on GPUs, gloo on CPUs), each running :func:`mage.trainer.sharded.run_update`: the policy
built on the base weights, the state of the iteration's starting checkpoint loaded into its
shards, the PPO update on its share of the scored table, the new state written to the
iteration's staging folder (``checkpoints/.update-<iteration>``). Only then does the driver take
the trained weights into its policy; the checkpoint the loop writes next moves the workers'
sharded state into itself.

The workers change nothing the driver holds until they all finish, so a try that fails (a
worker killed, a node lost) is repeated whole from the same checkpoint by the task's retry, and
gives what an uninterrupted try gives. The workers start for each update: their state lives
in the checkpoints between iterations, which is what lets a run resume on another number of
workers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from prefect import task

from mage.run.layout import RunLayout
from mage.run.state import TrainingState
from mage.tensors import derive_seed
from mage.trainer import sharded
from mage.trainer.sharded import UpdateJob
from tasks.caching import STEP_DEFAULTS

#: The staging folder of an iteration's update, beside the checkpoints.
STAGING = ".update-{iteration:05d}"
METRICS = "metrics.json"


class UpdateWorkersError(RuntimeError):
    """The update's workers failed. ``transient``: work was lost with a process or node (the try
    is repeated whole, from the same checkpoint); a worker's own error (a bad setting, a bug) is
    not retried."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def lost_work(error: BaseException) -> bool:
    """Whether Ray Train's ``error`` is work lost with a worker process or node (Ray's own
    errors, or what :func:`tasks.caching.is_transient` retries), not an error of the update."""
    from tasks.caching import is_transient

    failures = getattr(error, "worker_failures", None)
    if not failures:  # the controller's, or a preemption
        return True
    # one worker's death breaks the others' collectives (gloo: "Connection closed by peer"):
    # a single lost worker makes the whole try lost work
    return any(type(f).__module__.startswith("ray.") or is_transient(f) for f in failures.values())


def _on_each_worker(config: dict[str, Any]) -> None:
    """Ray Train's loop on every worker: one update (its process group is already joined)."""
    import ray.train

    job: UpdateJob = config["job"]
    metrics = sharded.run_update(job)
    if ray.train.get_context().get_world_rank() == 0:
        (Path(job.out) / METRICS).write_text(json.dumps(metrics))
    ray.train.report({"iteration": job.iteration})  # every worker reports: it is a barrier


def fit(job: UpdateJob) -> dict[str, float]:
    """Run ``job`` on Ray Train's workers; their metrics (rank 0's, which every rank shares)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    train = job.settings.train
    gpus = int(train.worker_gpus)
    resources = {"CPU": float(train.worker_cpus)} | ({"GPU": float(gpus)} if gpus else {})
    out = Path(job.out)
    trainer = TorchTrainer(
        _on_each_worker,
        train_loop_config={"job": job},
        scaling_config=ScalingConfig(num_workers=train.workers, use_gpu=gpus > 0, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
        # no restarts inside Ray Train: the Prefect task's retry repeats the try from the checkpoint
        run_config=RunConfig(name=f"update-{job.iteration:05d}", storage_path=str(out.parent / ".ray-train"),
                             failure_config=FailureConfig(max_failures=0)),
    )
    try:
        trainer.fit()
    except Exception as error:  # Ray Train's errors wrap the worker's; one line names the update
        raise UpdateWorkersError(f"the update of iteration {job.iteration} on {train.workers} Ray Train workers "
                                 f"failed: {type(error).__name__}: {str(error)[-2000:]}", lost_work(error)) from error
    if not (out / METRICS).is_file():
        raise UpdateWorkersError(f"the update of iteration {job.iteration}: rank 0 wrote no {out / METRICS}", True)
    return json.loads((out / METRICS).read_text())


def update_on_workers(state: TrainingState, iteration: int) -> dict[str, float]:
    """The iteration's update on the workers, from ``state.checkpoint`` (None: the base model) and
    the scored table on disk; then the trained weights in the driver's policy and the sharded
    state waiting for the checkpoint (``state.sharded_state``)."""
    state.wait_for_checkpoint()  # the workers start from it, and a write behind links the last update's state
    settings = state.settings
    layout = RunLayout.of(settings)
    out = layout.checkpoints / STAGING.format(iteration=iteration)
    shutil.rmtree(out, ignore_errors=True)  # a failed try's
    out.mkdir(parents=True)
    resume = state.workers_resume or (state.checkpoint.path if state.checkpoint is not None else None)
    job = UpdateJob(settings, iteration, str(layout.rollout(iteration)), str(resume) if resume else None, str(out),
                    derive_seed(settings.seed, iteration, 1), settings.train.learning_rate_at(iteration))
    metrics = fit(job)
    sharded.load_trained(state.policy, out)
    state.iteration = iteration
    state.sharded_state = out / sharded.SHARDED_STATE
    if state.workers_resume is not None:  # continued: the next update resumes from this one's state
        shutil.rmtree(state.workers_resume, ignore_errors=True)
        state.workers_resume = None
    return metrics


# Retried: the workers change nothing until all of them finish (the module docstring).
@task(name="update-policy-on-workers", task_run_name="update-{iteration}-on-workers", **STEP_DEFAULTS)
def update_policy_on_workers(state: TrainingState, iteration: int) -> dict[str, float]:
    """One PPO update on ``train.workers`` Ray Train workers."""
    return update_on_workers(state, iteration)
