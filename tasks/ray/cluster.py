"""``flow.runner=ray``: Prefect's Ray task runner, the checks a cluster must pass, and the
run's rollout worker actors (``flows.common`` starts the runner and, inside it, :func:`on_ray`).

Every node of a cluster needs the same code and lock, the project at the same path (or an
absolute ``paths.artifacts``) on storage that every node mounts, and a Prefect API it can
reach. The runner hands its workers what they need (``PREFECT_API_URL``, where Prefect
keeps task results, the driver's working directory) and checks each node before any work:
a wrong address or a node that cannot see the shared root fails the flow at once, named.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect_ray import RayTaskRunner

from mage.config.sections import FlowSection
from mage.settings import Settings


class ClusterError(RuntimeError):
    """The Ray cluster cannot run this flow (named setting, node and cause)."""


def ray_runner(flow_cfg: FlowSection) -> Any:
    """A ``prefect_ray.RayTaskRunner`` on ``flow.ray.address`` (None: a local Ray of ``num_cpus``)."""
    from prefect.settings import get_current_settings

    from tasks.ray.setup import NAMESPACE, worker_runtime_env

    cfg = flow_cfg.ray
    settings = get_current_settings()
    # task results (the cache) must be one store for every node: the driver's, resolved
    env = {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(Path(settings.results.local_storage_path).expanduser().resolve())}
    if settings.api.url:
        env["PREFECT_API_URL"] = str(settings.api.url)
    # every worker process starts in the driver's working directory (tasks/ray/setup.py)
    runtime_env = worker_runtime_env(env)
    init: dict[str, Any] = {"namespace": NAMESPACE, "runtime_env": runtime_env, "log_to_driver": True}
    if cfg.address is None:
        # a local Ray of its own (never one that happens to run here), on the loopback interface only
        init |= {"address": "local", "num_cpus": cfg.num_cpus, "include_dashboard": False,
                 "_node_ip_address": "127.0.0.1"}
        return LoopbackRayTaskRunner(address=None, init_kwargs=init)
    local_ip = check_address(cfg.address, cfg.connect_timeout_seconds)
    if local_ip and not cfg.address.startswith("ray://"):
        # the driver joins as a node: on the interface it reaches the head by (127.0.0.1 for a local test cluster)
        init["_node_ip_address"] = local_ip
    return RayTaskRunner(address=cfg.address, init_kwargs=init)


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Inside: a Ray started here listens on 127.0.0.1 only. Ray binds its servers to every
    interface unless told that it is no cluster across machines
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by Ray and by the processes it starts)."""
    import ray

    # prefect_ray imports ray lazily (a LazyModule in sys.modules). On Python 3.11, importing a
    # submodule first loads ray in the middle of that import, which then makes a second
    # ``ray._private`` without its submodules (``ray._private.worker`` is then missing and
    # ray.init fails). Any attribute loads the whole package first.
    ray.__version__  # noqa: B018
    from ray._private import ray_constants

    variable, flag = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray was imported
    try:
        yield
    finally:
        if variable is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = variable
        ray_constants.ENABLE_RAY_CLUSTER = flag


class LoopbackRayTaskRunner(RayTaskRunner):
    """The Ray task runner with a local Ray that listens on 127.0.0.1 only (:func:`loopback_only`)."""

    def __enter__(self) -> Any:
        with contextlib.ExitStack() as stack:
            stack.enter_context(loopback_only())
            entered = super().__enter__()
            self._loopback = stack.pop_all()
        return entered

    def __exit__(self, *exc_info: object) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self._loopback.close()


def check_address(address: str, timeout: float) -> str | None:
    """Fail at once, naming the key, when nothing answers at ``address`` (Ray itself retries
    for minutes). Returns this machine's address on the way there (None for ``auto``)."""
    if address == "auto":
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as connection:
            return connection.getsockname()[0]
    except OSError as error:
        raise ClusterError(f"flow.ray.address: nothing answers at {host}:{port} within {timeout:g} s ({error}); start "
                           "the cluster (`ray start --head` on its head node) or set flow.ray.address=null for a "
                           "local Ray") from error


def _inspect_node(marker: str, token: str) -> dict[str, Any]:
    """Run on one node: can it see the shared root and the driver's code?"""
    import ray

    from tasks.caching import library_source_hash
    from tasks.ray.setup import project_dir_problem

    found: dict[str, Any] = {"node": ray.util.get_node_ip_address(), "problems": []}
    if problem := project_dir_problem():
        found["problems"].append(problem)
        return found
    path = Path(marker)
    if not path.is_file() or path.read_text() != token:
        found["problems"].append(f"cannot see {path.parent.parent} (paths.artifacts), the shared root: mount it "
                                 "at the same path on every node")
    found["library"] = library_source_hash()
    return found


def check_cluster(settings: Settings) -> int:
    """Every alive node sees the shared root and runs the driver's code; returns the node count."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tasks.caching import library_source_hash

    root = Path(settings.paths.artifacts).resolve()
    marker, token = root / ".cluster-check" / f"{uuid.uuid4().hex}", uuid.uuid4().hex
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(token)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        inspect = ray.remote(num_cpus=0, max_retries=0)(_inspect_node)
        found = ray.get([inspect.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                         .remote(str(marker), token) for n in nodes])
    finally:
        marker.unlink(missing_ok=True)
    mine = library_source_hash()
    problems = [f"node {f['node']}: {p}" for f in found for p in f["problems"]]
    problems += [f"node {f['node']}: runs other code than this driver (mage differs): install the same commit and "
                 "lock on every node" for f in found if f.get("library") not in (None, mine)]
    if problems:
        raise ClusterError("the Ray cluster cannot run this flow: " + "; ".join(problems))
    return len(nodes)


def check_room(settings: Settings) -> None:
    """The cluster holds every long-lived worker at once, the update's workers with them
    (:func:`mage.preflight.placement.check_placement`): one that does not fit would never start, and its
    shard or the update would wait for ever."""
    import ray

    from mage.preflight.placement import PlacementError, check_placement

    try:
        check_placement(settings, ray.cluster_resources())
    except PlacementError as error:
        raise ClusterError(str(error)) from None


@contextlib.contextmanager
def rollout_workers(settings: Settings, shards: int) -> Iterator[list[Any]]:
    """The run's rollout worker actors, one per shard, created once and killed when the flow
    ends however it ends (a driver that dies takes them with it: they are not detached)."""
    import ray

    from tasks.ray.rollouts import RolloutActor, actor_name
    from tasks.ray.setup import NAMESPACE

    cfg = settings.flow.ray
    actor = ray.remote(RolloutActor)
    handles: list[Any] = []
    try:
        for shard in range(shards):
            handles.append(actor.options(name=actor_name(settings.run_name, shard), namespace=NAMESPACE,
                                         num_cpus=cfg.shard_cpus, num_gpus=cfg.shard_gpus,
                                         max_restarts=cfg.worker_restarts, max_task_retries=0).remote(settings))
        yield handles
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)


@contextlib.contextmanager
def on_ray(settings: Settings, shards: int) -> Iterator[list[Any]]:
    """Inside a flow whose Ray runner has started: for a training run (``shards`` > 0) check
    that its update workers and engines fit the cluster's resources, first (it reads them and
    touches nothing), then that every node sees the shared root and runs this code; then hold the
    run's rollout workers (none for ``shards`` 0 or without long-lived workers)."""
    if shards:
        check_room(settings)
    check_cluster(settings)
    if shards and settings.flow.ray.long_lived_workers:
        with rollout_workers(settings, shards) as handles:
            yield handles
    else:
        yield []
