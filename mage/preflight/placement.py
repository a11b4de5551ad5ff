"""Where a run's update workers and rollout engines go on a Ray cluster, and whether they fit it,
checked before any work.

With ``flow.runner=ray`` the rollout shards' engines are long-lived Ray actors (``flow.rollout_shards``
of them, ``flow.ray.shard_gpus`` GPUs and ``flow.ray.shard_cpus`` CPUs each), and with
``train.workers`` N > 1 the update runs as N Ray Train workers (``train.worker_gpus`` and
``train.worker_cpus`` each). ``flow.placement`` says how they share the GPUs:

* ``split``: on separate GPUs; the cluster needs the update's GPUs plus the engines';
* ``colocated``: on the same GPUs, the engines asleep during the update; the cluster needs the
  larger of the two.

Engines of a fraction of a GPU pack ``floor(1 / shard_gpus)`` to a GPU (Ray does not split one
actor over two GPUs), so five engines of 0.5 take three GPUs, not 2.5. With ``train.workers``
1 the update runs in the flow's process, on a GPU Ray does not hand out, and is not counted;
the other runners put nothing on a cluster.

This module sits on the floor of the validated settings and imports no Ray: the flows hand
:func:`check_placement` what ``ray.cluster_resources()`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mage.settings import Settings, SettingsError

#: Ray's resource sums are floats: a fraction of a GPU times a count may miss by an ulp.
EPS = 1e-9


class PlacementError(SettingsError):
    """The update workers and the engines do not fit the cluster (the message names the keys)."""


@dataclass(frozen=True)
class Placement:
    """What runs on a Ray cluster during a run, and what it takes.

    ``workers`` 0: the update runs in the flow's process (``train.workers=1``); ``engines`` 0: no
    engine on the cluster (another runner). ``engines_at_once`` is what must fit at one time:
    every engine with long-lived workers, else one shard task (the others wait their turn)."""

    placement: str  # split | colocated
    workers: int
    worker_gpus: int
    worker_cpus: float
    sharding: str
    engines: int
    engines_at_once: int
    shard_gpus: float
    shard_cpus: float

    @property
    def on_cluster(self) -> bool:
        return bool(self.workers or self.engines)

    @property
    def engines_per_gpu(self) -> int:
        """Engines that share one GPU (1 for a whole GPU or more, or none)."""
        if 0 < self.shard_gpus < 1:
            return math.floor(1 / self.shard_gpus + EPS)
        return 1

    @property
    def worker_gpus_total(self) -> int:
        return self.workers * self.worker_gpus

    @property
    def engine_gpus_total(self) -> int:
        """Whole GPUs the engines that run at once take."""
        if not self.shard_gpus or not self.engines_at_once:
            return 0
        if self.shard_gpus >= 1:
            return self.engines_at_once * math.ceil(self.shard_gpus - EPS)
        return math.ceil(self.engines_at_once / self.engines_per_gpu)

    @property
    def gpus(self) -> int:
        """Whole GPUs the cluster must have."""
        if self.placement == "colocated":
            return max(self.worker_gpus_total, self.engine_gpus_total)
        return self.worker_gpus_total + self.engine_gpus_total

    @property
    def cpus(self) -> float:
        return self.workers * self.worker_cpus + self.engines_at_once * self.shard_cpus

    def describe(self) -> str:
        """One line: what runs where."""
        if not self.on_cluster:
            return "nothing on a Ray cluster: the update and the rollouts run in the flow's processes"
        update = (f"{self.workers} update workers ({self.sharding}) of {self.worker_gpus} GPU and "
                  f"{self.worker_cpus:g} CPU each" if self.workers else "the update in the flow's process (not counted)")
        engines = f"{self.engines} engines of {self.shard_gpus:g} GPU and {self.shard_cpus:g} CPU each" + (
            f" ({self.engines_at_once} at once)" if self.engines_at_once != self.engines else "")
        return (f"{update}; {engines}; {self.placement}: {self.gpus} GPUs and {self.cpus:g} CPUs "
                f"(update {self.worker_gpus_total} GPUs, engines {self.engine_gpus_total})")


def placement(settings: Settings) -> Placement:
    """The placement ``settings`` ask for on a Ray cluster (nothing for another runner)."""
    train, flow = settings.train, settings.flow
    ray = flow.runner == "ray"
    engines = flow.rollout_shards if ray else 0
    return Placement(placement=flow.placement, workers=train.workers if ray and train.workers > 1 else 0,
                     worker_gpus=train.worker_gpus, worker_cpus=train.worker_cpus, sharding=train.sharding,
                     engines=engines, engines_at_once=engines if flow.ray.long_lived_workers else min(engines, 1),
                     shard_gpus=flow.ray.shard_gpus, shard_cpus=flow.ray.shard_cpus)


def check_placement(settings: Settings, resources: Mapping[str, float]) -> Placement:
    """Refuse ``settings`` whose update workers and engines do not fit a cluster of ``resources``.

    Args:
        settings: validated settings.
        resources: the cluster's resources as ``ray.cluster_resources()`` gives them
            (``{"CPU": 64.0, "GPU": 8.0, ...}``; a missing one is 0).

    Returns:
        The placement (:func:`placement`).

    Raises:
        PlacementError: the GPUs or the CPUs needed exceed the cluster's; the message starts
            with the key to change and names every key of the sum.
    """
    where = placement(settings)
    if not where.on_cluster:
        return where
    have_gpus, have_cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    if where.gpus > have_gpus + EPS:
        raise PlacementError(_too_few(where, "GPU", where.gpus, have_gpus))
    if where.cpus > have_cpus + EPS:
        raise PlacementError(_too_few(where, "CPU", where.cpus, have_cpus))
    return where


def _too_few(where: Placement, resource: str, need: float, have: float) -> str:
    gpu = resource == "GPU"
    worker_each, shard_each = (where.worker_gpus, where.shard_gpus) if gpu else (where.worker_cpus, where.shard_cpus)
    terms, keys = [], []
    if where.workers and worker_each:
        terms.append(f"{where.workers} update workers of {worker_each:g} {resource} each "
                     f"(train.workers x train.worker_{resource.lower()}s)")
        keys.append("train.workers")
    if where.engines_at_once and shard_each:
        packed = f", {where.engines_per_gpu} to a GPU" if gpu and where.engines_per_gpu > 1 else ""
        terms.append(f"{where.engines_at_once} rollout workers of {shard_each:g} {resource} each "
                     f"(flow.rollout_shards x flow.ray.shard_{resource.lower()}s{packed})")
        keys.append("flow.rollout_shards")
    join = " + " if where.placement == "split" or not gpu else " beside "
    how = f" ({where.placement})" if gpu and where.workers else ""
    # the key to change first: the engines when the update alone fits, else the update's workers
    alone = where.worker_gpus_total if gpu else where.workers * where.worker_cpus
    first = "flow.rollout_shards" if "flow.rollout_shards" in keys and alone <= have + EPS else keys[0]
    fixes = " or ".join(keys)
    if gpu and where.placement == "split" and where.workers and where.engines_at_once:
        fixes += ", or set flow.placement=colocated (they share GPUs, the engines asleep during the update)"
    return (f"{first}: {join.join(terms)} need {need:g} {resource}s{how}, the Ray cluster has {have:g}; "
            f"lower {fixes}, or add nodes")
