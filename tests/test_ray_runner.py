"""``flow.runner=ray`` on a cluster of two Ray nodes on 127.0.0.1 (one CPU each, started
and stopped here): the same table, weights and report as on one machine, a killed worker
actor retried, and a wrong address or an unseen shared root named before any work."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import psutil
import pytest
import torch
from test_flows import final_weights, overrides, task_runs

from flows import evaluate, train
from flows.ray_cluster import ClusterError
from mage.settings import load_settings
from mage.train.loop import RunPaths
from tasks import state as memory

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def ray_cluster():
    """Two nodes on the loopback interface (Ray's switch for a machine that is no cluster:
    without it Ray turns 127.0.0.1 into this machine's network address)."""
    from ray.cluster_utils import Cluster

    from flows.ray_cluster import loopback_only

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args=node)
        try:
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            yield cluster.address
        finally:
            cluster.shutdown()


@pytest.fixture(autouse=True)
def fresh_memory():
    memory.forget()
    yield
    memory.forget()


def on(address: str) -> list[str]:
    return ["flow.runner=ray", f"flow.ray.address={address}", "flow.rollout_shards=2"]


def test_a_local_ray_listens_on_the_loopback_interface_only():
    """First in this module: before the test cluster sets the same switch for its own nodes."""
    from flows.ray_cluster import ray_runner

    loopback = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
    with ray_runner(load_settings(["flow.runner=ray", "flow.ray.num_cpus=1"]).flow):
        children = psutil.Process().children(recursive=True)
        listening = {(p.name(), c.laddr.ip) for p in children for c in p.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN}
    assert listening, "no Ray process was listening"
    assert {ip for _, ip in listening} <= loopback, sorted(listening)


def tables(settings) -> pl.DataFrame:
    """Every iteration's scored table, in a stable order."""
    paths = sorted(RunPaths.of(settings).rollouts.glob("iteration-*.parquet"))
    return pl.concat([pl.read_parquet(p) for p in paths]).sort("iteration", "meta_id", "episode", "turn", "phase")


def assert_same_tables(a: pl.DataFrame, b: pl.DataFrame) -> None:
    a, b = a.drop("run_id", strict=False), b.drop("run_id", strict=False)
    assert a.columns == b.columns and a.height == b.height > 0
    differ = [c for c in a.columns if c != "response_logprobs" and not a[c].equals(b[c])]
    assert not differ, f"columns that differ: {differ}"
    # A Ray worker runs torch with its shard's CPUs (OMP_NUM_THREADS=1 here): float32 sums in
    # another order, so the recorded log-probabilities agree to rounding, not to the bit
    # (measured: 4.8e-7 at most). The sampled tokens above are the same.
    mine, theirs = (torch.tensor([x for row in t["response_logprobs"].to_list() for x in row]) for t in (a, b))
    assert torch.allclose(mine, theirs, rtol=0, atol=1e-5), (mine - theirs).abs().max()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


@pytest.fixture(scope="module")
def on_one_machine(tiny_model_dir, tmp_path_factory):
    """The reference: the same run with two shards on the thread runner."""
    artifacts = tmp_path_factory.mktemp("thread")
    config = overrides(tiny_model_dir, artifacts, "flow.rollout_shards=2")
    train(config)
    settings = load_settings(config)
    return {"tables": tables(settings), "weights": final_weights(settings), "config": config}


def test_train_on_ray_gives_the_thread_runner_s_table_and_weights(ray_cluster, tiny_model_dir, tmp_path, on_one_machine):
    config = overrides(tiny_model_dir, tmp_path, *on(ray_cluster))
    state = train(config, return_state=True)
    assert state.is_completed()
    settings = load_settings(config)
    mine = tables(settings)
    assert_same_tables(mine, on_one_machine["tables"])
    assert_same_weights(final_weights(settings), on_one_machine["weights"])
    runs = task_runs(state)
    assert {runs[f"rollout-{i}-shard-{s}"].state.name for i in (1, 2) for s in (0, 1)} == {"Completed"}


def test_a_ray_run_reuses_what_the_thread_runner_computed(ray_cluster, on_one_machine):
    """Where a task runs is no part of its cache key (``flow`` is a schedule section): the
    thread runner's finished run, run again on Ray, computes nothing."""
    state = train([*on_one_machine["config"], *on(ray_cluster)], return_state=True)
    assert state.is_completed()
    runs = task_runs(state)
    assert {f"rollout-{i}-shard-{s}" for i in (1, 2) for s in (0, 1)} <= set(runs)
    assert all(run.state.name == "Cached" for run in runs.values()), {n: r.state.name for n, r in runs.items()}
    assert_same_weights(final_weights(load_settings(on_one_machine["config"])), on_one_machine["weights"])


@contextlib.contextmanager
def killing_the_first(marker: str) -> Iterator[list[int]]:
    """While the block runs, SIGKILL the first process whose command line names ``marker``
    (Ray titles a busy worker ``ray::<task>`` or ``<Actor>.<method>``); yields the killed pids."""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 300
        while not killed and time.monotonic() < deadline:
            for process in psutil.process_iter(["pid", "cmdline"]):
                if any(marker in part for part in process.info["cmdline"] or ()):
                    process.kill()
                    killed.append(process.info["pid"])
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    yield killed
    killer.join(5)


def test_a_killed_worker_actor_is_retried_and_nothing_is_lost(ray_cluster, tiny_model_dir, tmp_path, on_one_machine):
    """SIGKILL one worker actor in the middle of its first shard: Ray starts it again, Prefect
    retries that shard alone, and the run ends with the thread runner's weights."""
    config = overrides(tiny_model_dir, tmp_path, *on(ray_cluster), "flow.retries=2")
    with killing_the_first("RolloutActor.play") as killed:
        state = train(config, return_state=True)
    assert killed, "no worker actor was seen playing"
    assert state.is_completed()
    runs = task_runs(state)
    shards = {name: run for name, run in runs.items() if name.startswith("rollout-")}
    assert sorted(run.run_count for run in shards.values()) == [1, 1, 1, 2], {n: r.run_count for n, r in shards.items()}
    assert all(run.run_count == 1 for name, run in runs.items() if name not in shards)  # nothing else ran twice
    settings = load_settings(config)
    assert_same_tables(tables(settings), on_one_machine["tables"])
    assert_same_weights(final_weights(settings), on_one_machine["weights"])


def test_per_task_workers_survive_a_killed_task_process(ray_cluster, tiny_model_dir, tmp_path, on_one_machine):
    """``flow.ray.long_lived_workers=false``: each shard is a Ray task that builds its own
    engine. SIGKILL the first one's process: it took Prefect's task engine with it, so Ray runs
    it again, and the run ends with the thread runner's tables and weights."""
    config = overrides(tiny_model_dir, tmp_path, *on(ray_cluster), "flow.ray.long_lived_workers=false")
    with killing_the_first("ray::rollout-shard") as killed:
        state = train(config, return_state=True)
    assert killed, "no shard task was seen running"
    assert state.is_completed()
    settings = load_settings(config)
    assert_same_tables(tables(settings), on_one_machine["tables"])
    assert_same_weights(final_weights(settings), on_one_machine["weights"])


def test_a_restarting_worker_is_awaited_and_a_dead_one_is_not_retried(ray_cluster):
    """wait_until_started returns once a killed actor has restarted; when its restarts are
    spent it raises an error that the retry rule refuses, where Ray's own is retried."""
    import ray

    from tasks.caching import is_transient
    from tasks.ray_workers import RolloutWorkerGone, wait_until_started

    @ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    ray.init(address=ray_cluster)
    try:
        actor = Probe.remote()
        first = ray.get(actor.pid.remote())
        psutil.Process(first).kill()
        wait_until_started(actor, timeout=120)  # the one restart
        second = ray.get(actor.pid.remote())
        assert second != first
        psutil.Process(second).kill()  # no restart left
        with pytest.raises(RolloutWorkerGone, match="flow.ray.worker_restarts are spent") as gone:
            wait_until_started(actor, timeout=120)
        assert isinstance(gone.value.__cause__, ray.exceptions.ActorDiedError)
        assert is_transient(gone.value.__cause__) and not is_transient(gone.value)
    finally:
        ray.shutdown()


def test_evaluate_on_ray_gives_the_same_report(ray_cluster, tiny_model_dir, tmp_path, on_one_machine):
    config = on_one_machine["config"]
    checkpoint = str(max(RunPaths.of(load_settings(config)).checkpoints.glob("ckpt-*")))
    here = evaluate(config, checkpoint=checkpoint, split="all", out_dir=str(tmp_path / "thread"))
    there = evaluate([*config, *on(ray_cluster)], checkpoint=checkpoint, split="all", out_dir=str(tmp_path / "ray"))
    assert here["metrics"] == there["metrics"] and here["metrics"]
    for split in ("train", "held_out"):
        assert_same_tables(*(pl.read_parquet(tmp_path / name / f"{split}.parquet") for name in ("ray", "thread")))


def test_more_workers_than_the_cluster_holds_fail_at_once_naming_the_key(ray_cluster, tiny_model_dir, tmp_path):
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"^flow\.rollout_shards: 3 rollout workers of 1 CPU each .* has 2"):
        train(overrides(tiny_model_dir, tmp_path, "flow.runner=ray", f"flow.ray.address={ray_cluster}",
                        "flow.rollout_shards=3"))
    assert time.monotonic() - started < 60


def test_a_wrong_address_fails_at_once_naming_the_key(tiny_model_dir, tmp_path):
    from conftest import free_port

    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"^flow\.ray\.address: nothing answers at 127\.0\.0\.1:"):
        train(overrides(tiny_model_dir, tmp_path, "flow.runner=ray", f"flow.ray.address=127.0.0.1:{free_port()}",
                        "flow.ray.connect_timeout_seconds=2"))
    assert time.monotonic() - started < 30
    assert not (Path(tmp_path) / "runs").exists() or not any((Path(tmp_path) / "runs").rglob("ckpt-*"))


def test_the_command_line_on_a_local_ray_gives_the_same_weights(tiny_model_dir, tmp_path, on_one_machine):
    """The README's `python -m flows train flow.runner=ray ...`: no cluster address, so the
    flow starts a Ray of its own on 127.0.0.1 (and its own Prefect server) and stops both."""
    import subprocess
    import sys

    config = overrides(tiny_model_dir, tmp_path, "flow.runner=ray", "flow.rollout_shards=2")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "flows", "train", *config], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Creating a local Ray instance" in done.stderr + done.stdout
    assert_same_weights(final_weights(load_settings(config)), on_one_machine["weights"])
    assert_same_tables(tables(load_settings(config)), on_one_machine["tables"])

