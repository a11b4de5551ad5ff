"""``train.workers=2``: the update on two Ray Train workers (gloo, FSDP2) inside the train flow,
on a cluster of two Ray nodes on 127.0.0.1 (one CPU each, started and stopped here). One run of
the 2-iteration flow, with a worker SIGKILLed in the middle of its second update, serves every
test: its first update equals the same update in one process, and the retried second equals,
bit for bit, the same update run uninterrupted on Ray Train's workers. The references are
computed here: the first by :func:`mage.trainer.sharded.run_update` in this process, the second
by the same Ray Train workers (two gloo ranks of torch.multiprocessing gave other bits).
tests/test_distributed_update.py holds run_update on ranks equal to the one-process trainer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_flows import overrides, task_runs
from test_ray_runner import assert_same_weights, killing_the_first, on

from flows import train
from mage.models import checkpoint as ckpt
from mage.run import RunLayout
from mage.settings import load_settings
from mage.tensors import derive_seed
from mage.trainer.sharded import WEIGHTS, UpdateJob, run_update
from tasks import worker
from tasks.ray.update import fit

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]


def two_workers(address: str) -> list[str]:
    """Two gloo update workers of half a CPU beside two rollout actors of half a CPU: the two
    one-CPU nodes hold them all at once."""
    return [*on(address), "flow.ray.shard_cpus=0.5", "train.workers=2", "train.worker_gpus=0", "train.worker_cpus=0.5"]


def checkpoint_weights(settings, iteration: int) -> dict[str, torch.Tensor]:
    return load_file(RunLayout.of(settings).checkpoints / f"ckpt-{iteration:05d}" / "model.safetensors")


@contextlib.contextmanager
def on_the_cluster(address: str) -> Iterator[None]:
    """This process as a Ray driver of ``address``, set up as the train flow sets its workers up."""
    import ray

    from tasks.ray.cluster import loopback_only
    from tasks.ray.setup import NAMESPACE, worker_runtime_env

    runtime_env = worker_runtime_env({})
    with loopback_only():
        ray.init(address=address, namespace=NAMESPACE, runtime_env=runtime_env, _node_ip_address="127.0.0.1")
        try:
            yield
        finally:
            ray.shutdown()


def update_job(settings, iteration: int, out) -> UpdateJob:
    """The flow's update of ``iteration``: its scored table, from the checkpoint before it."""
    layout = RunLayout.of(settings)
    resume = str(layout.checkpoints / f"ckpt-{iteration - 1:05d}") if iteration > 1 else None
    return UpdateJob(settings, iteration, str(layout.rollout(iteration)), resume, str(out),
                     derive_seed(settings.seed, iteration, 1), settings.train.learning_rate_at(iteration))


@pytest.fixture(scope="module")
def on_two_workers(ray_address, tiny_model_dir, tmp_path_factory):
    """The 2-iteration train flow with train.workers=2, one Ray Train worker SIGKILLed in the
    middle of the second update (as the workers write its state)."""
    worker.forget()
    config = overrides(tiny_model_dir, tmp_path_factory.mktemp("two-workers"), *two_workers(ray_address),
                       "flow.retries=2")
    writing = RunLayout.of(load_settings(config)).checkpoints / ".update-00002" / "trainer_state"
    with killing_the_first("RayTrainWorker", ready=writing.exists) as killed:
        state = train(config, return_state=True)
    worker.forget()
    return {"state": state, "settings": load_settings(config), "killed": killed}


def test_the_update_on_two_workers_of_ray_train_equals_one_process(on_two_workers, tmp_path):
    """The flow completes; its first update equals the same update in one process within 1e-5
    (the ranks sum in another order) and moved the weights; each checkpoint holds the workers'
    sharded state beside ordinary model files, and no staging folder is left."""
    assert on_two_workers["state"].is_completed()
    settings = on_two_workers["settings"]
    run_update(update_job(settings, 1, tmp_path))  # torch.distributed not started: one process
    mine, alone = checkpoint_weights(settings, 1), load_file(tmp_path / WEIGHTS)
    assert mine.keys() == alone.keys()
    assert max(float((mine[k] - alone[k]).abs().max()) for k in mine) <= 1e-5
    before = load_file(next(Path(settings.model.path).glob("*.safetensors")))
    assert any(not torch.equal(mine[k], before[k]) for k in mine if k in before)
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    assert latest.iteration == 2 and latest.sharded
    assert any(name.startswith("trainer_state/") for name in latest.manifest["files"])
    assert not list(RunLayout.of(settings).checkpoints.glob(".update-*"))  # staging moved into the checkpoints


def test_a_killed_update_worker_is_retried_from_the_checkpoint_and_gives_the_same_weights(on_two_workers, ray_address,
                                                                                          tmp_path):
    """The killed try of the second update failed cleanly and the task's retry ran it again from
    the first checkpoint: its weights equal, bit for bit, the same update run uninterrupted by
    the same Ray Train workers from that checkpoint. (A worker killed while Ray Train starts them is started
    again by Ray Train itself.)"""
    assert on_two_workers["killed"], "no Ray Train worker was seen writing the second update's state"
    assert on_two_workers["state"].is_completed()
    runs = task_runs(on_two_workers["state"])
    assert [runs[f"update-{i}-on-workers"].run_count for i in (1, 2)] == [1, 2]
    settings = on_two_workers["settings"]
    with on_the_cluster(ray_address):
        fit(update_job(settings, 2, tmp_path))
    uninterrupted, retried = load_file(tmp_path / WEIGHTS), checkpoint_weights(settings, 2)
    assert_same_weights({k: retried[k] for k in uninterrupted}, uninterrupted)
