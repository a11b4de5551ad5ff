"""A rollout worker: one generation engine and the policy it samples from, kept between
iterations.

It holds no trainer and no optimizer. Each iteration names the checkpoint to sample from by
path, and the worker loads it only when it differs from the one it holds: a LoRA adapter
or full weights into its own copy of the model (``hf``), or into its engine (``vllm``). The
engine is built once, so a run pays a model load per worker, not per iteration.

The flows keep one per process (thread, process and sequential runners) or one per shard in
a Ray actor (``flows/ray_cluster.py``); the library's own loop (``mage.train.loop.train``)
still samples from the trainer's policy in memory. Whichever holds it, a worker given the
same checkpoint, iteration and shard plays the same table.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import torch

from mage.backends import Backend
from mage.models.policy import Policy
from mage.rollout import RolloutStats, write_trajectories
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.loop import RunPaths, load_run_policy, rollout_backend, rollout_iteration


class RolloutWorker:
    """The engine of one rollout shard (or of a whole iteration) and the policy it samples from."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._backend: Backend | None = None
        self._policy: Policy | None = None  # hf only: the weights the backend samples with
        self._held: str | None = None  # the content hash of the checkpoint held (None: the starting policy)

    def sample_from(self, checkpoint: str | Path | None) -> Backend:
        """The engine, sampling from ``checkpoint`` (None: the run's starting policy)."""
        wanted = ckpt.content_hash(checkpoint) if checkpoint is not None else None
        if self._backend is not None and self._held == wanted:
            return self._backend
        loaded = ckpt.Checkpoint.at(checkpoint) if checkpoint is not None else None
        if self._backend is not None and loaded is not None and self._policy is not None:
            ckpt.load_weights(self._policy, loaded)  # hf: new weights into the model the backend holds
        elif self._backend is not None and loaded is not None:
            self._backend.load_checkpoint(loaded.path, loaded.kind)  # vllm: the engine swaps them
        else:  # first use, or back to the starting policy: build it
            self.close()
            self._backend = self._build(loaded)
        self._held = wanted
        return self._backend

    def _build(self, loaded: ckpt.Checkpoint | None) -> Backend:
        if self.settings.engine.backend != "hf":
            return rollout_backend(self.settings, checkpoint=loaded)
        # A fresh LoRA adapter is drawn from torch's global generator: seeded as the trainer
        # seeds it (mage.train.loop.start_training), the starting policy is the trainer's.
        torch.manual_seed(self.settings.train.seed)
        self._policy = load_run_policy(self.settings, loaded, trainable=False)
        return rollout_backend(self.settings, policy=self._policy)

    def play(
        self, iteration: int, checkpoint: str | Path | None, shard: int = 0, shards: int = 1, progress: bool = False
    ) -> tuple[pl.DataFrame, RolloutStats]:
        """Shard ``shard`` of iteration ``iteration``'s meta-episodes, sampled from ``checkpoint``."""
        backend = self.sample_from(checkpoint)
        return rollout_iteration(self.settings, backend, iteration, progress=progress, shard=shard, shards=shards)

    def play_shard(
        self, iteration: int, checkpoint: str | Path | None, shard: int = 0, shards: int = 1
    ) -> tuple[Path, RolloutStats]:
        """:meth:`play`, with the table written where the run keeps shard tables."""
        table, stats = self.play(iteration, checkpoint, shard, shards)
        return write_trajectories(table, RunPaths.of(self.settings).rollout_shard(iteration, shard)), stats

    def sleep(self) -> None:
        """Give the accelerator to a trainer in the same process (vLLM's sleep mode) until :meth:`wake_up`."""
        if self._backend is not None:
            self._backend.sleep()

    def wake_up(self) -> None:
        if self._backend is not None:
            self._backend.wake_up()

    def close(self) -> None:
        """Release the engine and the policy (a vLLM engine stays for the process's next user)."""
        if self._backend is not None:
            self._backend.release()
        self._backend, self._policy, self._held = None, None, None
