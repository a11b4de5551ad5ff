"""``flow.runner=ray`` on a cluster of two Ray nodes on 127.0.0.1 (one CPU each, started
and stopped here): the same table, weights and report as on one machine, a killed worker
actor or task process retried, and a wrong address or an unseen shared root named before
any work."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import psutil
import pytest
import torch
from conftest import prefect_home
from test_flows import final_weights, overrides, task_runs

from flows import evaluate, train
from mage.run import RunLayout
from mage.settings import load_settings
from tasks import worker
from tasks.ray.cluster import ClusterError

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture(autouse=True)
def fresh_memory():
    worker.forget()
    yield
    worker.forget()


def on(address: str) -> list[str]:
    return ["flow.runner=ray", f"flow.ray.address={address}", "flow.rollout_shards=2"]


def test_a_local_ray_listens_on_the_loopback_interface_only():
    """First in this module: before the test cluster sets the same switch for its own nodes.
    A task runs first, so that a worker process (which serves its own port) is among them."""
    import ray

    from tasks.ray.cluster import ray_runner

    class Worker:
        def pid(self) -> int:
            return os.getpid()

    loopback = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
    listening: set[tuple[int, str, str]] = set()
    with ray_runner(load_settings(["flow.runner=ray", "flow.ray.num_cpus=1"]).flow):
        actor = ray.remote(num_cpus=0)(Worker).remote()  # held: its process stays while the ports are read
        worker = ray.get(actor.pid.remote())
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                listening |= {(process.pid, process.name(), c.laddr.ip) for c in process.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN}
    assert worker in {pid for pid, _, _ in listening}, f"the task's worker {worker} is not listening: {listening}"
    assert {ip for _, _, ip in listening} <= loopback, sorted(listening)


def test_the_loopback_switch_leaves_a_lazily_imported_ray_whole():
    """prefect_ray puts a lazy ``ray`` in sys.modules; the switch imports a submodule of it,
    and on Python 3.11 that once left ``ray._private`` without ``worker`` (ray.init failed).
    A fresh interpreter, since this one has long loaded ray; this module's imports are the
    order that showed it."""
    import subprocess
    import sys

    check = ("import sys, test_flows\n"
             "from tasks.ray.cluster import loopback_only\n"
             "with loopback_only(): pass\n"
             "import ray\n"
             "assert not ray.is_initialized() and 'worker' in vars(sys.modules['ray._private'])\n")
    done = subprocess.run([sys.executable, "-c", check], cwd=Path(__file__).parent, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def tables(settings) -> pl.DataFrame:
    """Every iteration's scored table, in a stable order."""
    paths = sorted(RunLayout.of(settings).rollouts.glob("iteration-*.parquet"))
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


def assert_same_run(config: list[str], reference: dict) -> None:
    """The run of ``config`` left the reference run's tables and final weights."""
    settings = load_settings(config)
    assert_same_tables(tables(settings), reference["tables"])
    assert_same_weights(final_weights(settings), reference["weights"])


@pytest.fixture(scope="module")
def on_one_machine(tiny_model_dir, tmp_path_factory):
    """The reference: the same run with two shards on the thread runner."""
    artifacts = tmp_path_factory.mktemp("thread")
    config = overrides(tiny_model_dir, artifacts, "flow.rollout_shards=2")
    train(config)
    settings = load_settings(config)
    return {"tables": tables(settings), "weights": final_weights(settings), "config": config}


def test_train_on_ray_gives_the_thread_runner_s_table_and_weights(ray_address, tiny_model_dir, tmp_path, on_one_machine):
    config = overrides(tiny_model_dir, tmp_path, *on(ray_address))
    state = train(config, return_state=True)
    assert state.is_completed()
    assert_same_run(config, on_one_machine)
    runs = task_runs(state)
    assert {runs[f"rollout-{i}-shard-{s}"].state.name for i in (1, 2) for s in (0, 1)} == {"Completed"}
    # the worker actors took update 1's weights through memory, checked (iteration 2's tables
    # equal the thread runner's: they sampled from them); after the last update nothing plays
    assert runs["push-weights-1"].state.name == "Completed" and "push-weights-2" not in runs
    assert any("to 2 of 2 rollout workers through memory" in line for line in task_logs(runs["push-weights-1"]))


def task_logs(run) -> list[str]:
    """What a task run logged, as the UI shows it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # what the flow logged reaches the server first
    with get_client(sync_client=True) as client:
        found = client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id])), limit=200, offset=0)
    return [log.message for log in found]


def test_a_ray_run_resumes_what_the_thread_runner_finished(ray_address, on_one_machine):
    """Where the shards run is no part of a run's identity (``flow.runner``; the shard count
    is): the thread runner's finished run, run again on Ray, computes nothing."""
    state = train([*on_one_machine["config"], *on(ray_address)], return_state=True)
    assert state.is_completed()
    runs = task_runs(state)
    assert set(runs) == {"prepare-model"} and runs["prepare-model"].state.name == "Cached", set(runs)
    assert_same_weights(final_weights(load_settings(on_one_machine["config"])), on_one_machine["weights"])


@contextlib.contextmanager
def killing_the_first(marker: str, ready: Callable[[], bool] = lambda: True) -> Iterator[list[int]]:
    """While the block runs, once ``ready()``, SIGKILL the first process under this one whose
    command line names ``marker`` (Ray titles a busy worker ``ray::<task>`` or
    ``<Actor>.<method>``); yields the killed pids. Only this process's descendants: the module's
    Ray cluster (its raylets are this process's children, its workers theirs), never another
    test file's, which may run beside it on the other pytest worker."""
    killed: list[int] = []
    done = threading.Event()
    me = psutil.Process()

    def marked() -> list[psutil.Process]:
        found = []
        for process in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(marker in part for part in process.cmdline()):
                    found.append(process)
        return found

    def kill() -> None:
        # Until ready, the marked processes are kept at hand (a scan of every process is slow on a
        # busy machine, and the moment to kill may be short); from ready on, 300 s to find one.
        at_hand: list[psutil.Process] = []
        scanned, deadline = 0.0, None
        while not killed and not done.is_set():
            now = time.monotonic()
            if not ready():
                if now - scanned > 0.25:
                    at_hand, scanned = marked(), now
                time.sleep(0.005)
                continue
            deadline = deadline or now + 300
            if now > deadline:
                return
            for process in at_hand + marked():
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    continue
                killed.append(process.pid)
                return
            at_hand = []
            time.sleep(0.02)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        done.set()
        killer.join(5)


def test_a_killed_worker_actor_is_retried_and_nothing_is_lost(ray_address, tiny_model_dir, tmp_path, on_one_machine):
    """SIGKILL one worker actor in the middle of its first shard: Ray starts it again, Prefect
    retries that shard alone, and the run ends with the thread runner's weights."""
    config = overrides(tiny_model_dir, tmp_path, *on(ray_address), "flow.retries=2")
    with killing_the_first("RolloutActor.play") as killed:
        state = train(config, return_state=True)
    assert killed, "no worker actor was seen playing"
    assert state.is_completed()
    runs = task_runs(state)
    shards = {name: run for name, run in runs.items() if name.startswith("rollout-")}
    assert sorted(run.run_count for run in shards.values()) == [1, 1, 1, 2], {n: r.run_count for n, r in shards.items()}
    assert all(run.run_count == 1 for name, run in runs.items() if name not in shards)  # nothing else ran twice
    assert_same_run(config, on_one_machine)


def test_per_task_workers_survive_a_killed_task_process(ray_address, tiny_model_dir, tmp_path, on_one_machine):
    """``flow.ray.long_lived_workers=false``: each shard is a Ray task that builds its own
    engine. SIGKILL the first one's process: it took Prefect's task engine with it, so Ray runs
    it again, and the run ends with the thread runner's tables and weights."""
    config = overrides(tiny_model_dir, tmp_path, *on(ray_address), "flow.ray.long_lived_workers=false")
    with killing_the_first("ray::rollout-shard") as killed:
        state = train(config, return_state=True)
    assert killed, "no shard task was seen running"
    assert state.is_completed()
    assert_same_run(config, on_one_machine)


def test_a_restarting_worker_is_awaited_and_a_dead_one_is_not_retried(ray_address):
    """wait_until_started returns once a killed actor has restarted; when its restarts are
    spent it raises an error that the retry rule refuses, where Ray's own is retried."""
    import ray

    from tasks.caching import is_transient
    from tasks.ray.rollouts import RolloutWorkerGone, wait_until_started

    @ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    ray.init(address=ray_address)
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


def test_evaluate_on_ray_gives_the_same_report_through_a_killed_split(ray_address, tiny_model_dir, tmp_path,
                                                                     on_one_machine):
    """Each split is a Ray task that runs Prefect's task engine. SIGKILL the first one: Ray
    runs it again (as a shard's, ``tasks.ray.rollouts.shard_options``), and the report is the one machine's."""
    config = on_one_machine["config"]
    checkpoint = str(max(RunLayout.of(load_settings(config)).checkpoints.glob("ckpt-*")))
    here = evaluate(config, checkpoint=checkpoint, split="all", out_dir=str(tmp_path / "thread"))
    with killing_the_first("ray::evaluate-checkpoint") as killed:
        there = evaluate([*config, *on(ray_address)], checkpoint=checkpoint, split="all", out_dir=str(tmp_path / "ray"))
    assert killed, "no evaluation split was seen running on Ray"
    assert here["metrics"] == there["metrics"] and here["metrics"]
    for split in ("train", "held_out"):
        assert_same_tables(*(pl.read_parquet(tmp_path / name / f"{split}.parquet") for name in ("ray", "thread")))


def nothing_played(artifacts: Path) -> bool:
    """No rollout table and no checkpoint under the run directory: the flow stopped before any work."""
    runs = artifacts / "runs"
    return not any(runs.rglob("ckpt-*")) and not any(runs.rglob("*.parquet"))


# "At once" is checked by what was done, not by the clock: a loaded machine took 112 s for
# this test. The timeout turns the failure it guards against, shards that wait for CPUs
# the cluster will never have, into a failure instead of a hang.
@pytest.mark.timeout(600)
def test_more_workers_than_the_cluster_holds_fail_at_once_naming_the_key(ray_address, tiny_model_dir, tmp_path):
    with pytest.raises(ClusterError, match=r"^flow\.rollout_shards: 3 rollout workers of 1 CPU each .* has 2"):
        train(overrides(tiny_model_dir, tmp_path, "flow.runner=ray", f"flow.ray.address={ray_address}",
                        "flow.rollout_shards=3", "engine.groups=3"))
    assert nothing_played(tmp_path)


@pytest.mark.timeout(600)
def test_a_wrong_address_fails_at_once_naming_the_key(tiny_model_dir, tmp_path):
    from conftest import free_port

    with pytest.raises(ClusterError, match=r"^flow\.ray\.address: nothing answers at 127\.0\.0\.1:"):
        train(overrides(tiny_model_dir, tmp_path, "flow.runner=ray", f"flow.ray.address=127.0.0.1:{free_port()}",
                        "flow.ray.connect_timeout_seconds=2"))
    assert nothing_played(tmp_path)


@contextlib.contextmanager
def node_without(hidden: Path) -> Iterator[str]:
    """A one-node Ray cluster on 127.0.0.1 whose node sees an empty directory at ``hidden``
    (a mount namespace of its own: the node that forgot to mount the shared storage);
    yields its address, and kills every process of the namespace after. Its Ray files go to
    a temporary directory of its own, so this machine's default cluster address is untouched."""
    import shlex
    import shutil
    import subprocess
    import sys
    import tempfile

    from conftest import free_port

    unshare, mount = shutil.which("unshare"), f"mount -t tmpfs none {shlex.quote(str(hidden))}"
    probe = unshare and subprocess.run([unshare, "--mount", "sh", "-c", mount], check=False, capture_output=True,
                                       text=True)
    if not probe or probe.returncode != 0:
        pytest.skip(f"no mount namespace with a tmpfs here: {probe.stderr.strip() if probe else 'no unshare'}")
    port, ray_files = free_port(), Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths
    ray_cli = shlex.quote(str(Path(sys.executable).with_name("ray")))
    start = (f"{mount} && exec {ray_cli} start --head --block --port={port} --num-cpus=1 --node-ip-address=127.0.0.1 "
             f"--temp-dir={ray_files} --include-dashboard=false --disable-usage-stats")
    # its servers on 127.0.0.1 only; no token authentication (`ray start` turns it on when
    # ~/.ray/auth_token exists, which a local Ray of an earlier test writes, and a driver
    # connects to such a cluster only with RAY_AUTH_MODE=token); its "started" line reaches the log at once
    env = os.environ | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    log = hidden.parent / "ray-head.log"
    with log.open("w") as out:
        head = subprocess.Popen([unshare, "--mount", "--propagation", "private", "sh", "-c", start], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    mine, namespace = os.readlink("/proc/self/ns/mnt"), None
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the Ray head did not start in 120 s"
            time.sleep(0.2)
        namespace = os.readlink(f"/proc/{head.pid}/ns/mnt")  # read once it serves: unshare has run
        assert namespace != mine
        yield f"127.0.0.1:{port}"
    finally:
        def in_namespace() -> list[psutil.Process]:
            found = []
            for process in psutil.process_iter():
                with contextlib.suppress(OSError, psutil.Error):
                    if namespace not in (None, mine) and os.readlink(f"/proc/{process.pid}/ns/mnt") == namespace:
                        found.append(process)
            return found

        # Ray's daemons leave the head's process tree; the namespace holds them all (until it is empty:
        # a raylet may start a worker while the pass runs)
        with contextlib.suppress(psutil.Error):
            head_process = psutil.Process(head.pid)
            for process in [head_process, *head_process.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        deadline = time.monotonic() + 30
        while (left := in_namespace()) and time.monotonic() < deadline:
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            time.sleep(0.1)
        head.wait(30)
        shutil.rmtree(ray_files, ignore_errors=True)


@pytest.mark.timeout(600)
def test_a_node_that_cannot_see_the_shared_root_is_named_before_any_work(tiny_model_dir, tmp_path):
    from tasks.ray.cluster import loopback_only

    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    with loopback_only(), node_without(artifacts) as address:
        seen = re.escape(f"node 127.0.0.1: cannot see {artifacts.resolve()} (paths.artifacts), the shared root")
        with pytest.raises(ClusterError, match=f"^the Ray cluster cannot run this flow: {seen}"):
            train(overrides(tiny_model_dir, artifacts, "flow.runner=ray", f"flow.ray.address={address}"))
    assert nothing_played(artifacts)


def test_the_command_line_on_a_local_ray_gives_the_same_weights(tiny_model_dir, tmp_path, on_one_machine,
                                                                 migrated_prefect_db):
    """The README's `python -m flows train flow.runner=ray ...`: no cluster address, so the
    flow starts a Ray of its own on 127.0.0.1 (and its own Prefect server) and stops both."""
    import subprocess
    import sys

    config = overrides(tiny_model_dir, tmp_path, "flow.runner=ray", "flow.rollout_shards=2")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env |= {"PREFECT_HOME": str(prefect_home(tmp_path / "prefect", migrated_prefect_db)),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-m", "flows", "train", *config], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Creating a local Ray instance" in done.stderr + done.stdout
    assert_same_run(config, on_one_machine)
