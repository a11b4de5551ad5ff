"""Rollouts outside the trainer's process (a process pool's worker, a Ray actor): a
:class:`RolloutWorker` keeps a generation engine, the policy it samples from and the league's
snapshots between iterations, and samples from the checkpoint each iteration names by path.

A worker given the same checkpoint as the trainer's :class:`~mage.run.state.TrainingState`
plays the same table for the same iteration and shard. Full weights can also be sent to it
through memory (:meth:`RolloutWorker.take_weights`; on Ray, ``tasks.ray.rollouts.push_weights``),
checked as the trainer's own engine is: its log-probs of a small probe must equal the trainer's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mage.backends import Backend, samples_from_a_given_model, weight_sync
from mage.models import checkpoint as ckpt
from mage.models.policy import Policy, load_run_policy, rollout_backend
from mage.run.snapshots import LeagueSnapshots
from mage.run.state import probe_logprobs
from mage.settings import Settings

#: What a rollout worker holds while pushed weights are being checked: no checkpoint's.
_UNCHECKED = "unchecked pushed weights"


class RolloutWorker:
    """A generation engine and the policy it samples from, kept between iterations, for
    rollouts outside the trainer's process. It holds no trainer: each iteration names the
    checkpoint to sample from by path, and the worker loads it only when it differs from the
    one it holds (a LoRA adapter or full weights into its own copy of the model with ``hf``, or
    into its engine with ``vllm``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._backend: Backend | None = None
        self._policy: Policy | None = None  # hf only: the weights the backend samples with
        self._held: str | None = None  # the weights_id of the checkpoint held (None: the starting policy)
        self.loads = self.pushes = 0  # checkpoints read from disk, and weights taken through memory
        #: the league's snapshots, as this worker's rollouts play them (released by :meth:`close`)
        self.snapshots = LeagueSnapshots(settings)

    def sample_from(self, checkpoint: str | Path | None, weights: str | None = None) -> Backend:
        """The engine, sampling from ``checkpoint`` (None: the run's starting policy). Given its
        ``weights`` (:func:`mage.models.checkpoint.weights_id`), a worker that was pushed them
        reads nothing, and one that was not waits for the checkpoint's files, which the
        trainer's process may still be writing behind."""
        if self._backend is not None and weights is not None and self._held == weights:
            return self._backend
        loaded = None
        if checkpoint is not None and weights is not None:
            loaded = ckpt.wait_until_written(checkpoint, weights)
        elif checkpoint is not None:
            loaded = ckpt.Checkpoint.at(checkpoint)
        wanted = ckpt.weights_id(loaded) if loaded is not None else None
        if self._backend is not None and self._held == wanted:
            return self._backend
        if self._backend is not None and loaded is not None and self._policy is not None:
            ckpt.load_weights(self._policy, loaded)  # hf: new weights into the model the backend holds
            self.loads += 1
        elif self._backend is not None and loaded is not None:
            self._backend.load_checkpoint(loaded.path, loaded.kind)  # vllm: the engine swaps them
            self.loads += 1
        else:  # first use, or back to the starting policy: build it
            self.close()
            self._backend = self._build(loaded)
        self._held = wanted
        return self._backend

    def take_weights(self, checkpoint: str, weights: str, chunks: Iterable[list[weight_sync.Encoded]],
                     probe: weight_sync.Probe, expected: list[list[float]]) -> dict[str, Any]:
        """The full weights of ``checkpoint`` (named ``weights``: its
        :func:`~mage.models.checkpoint.weights_id`, known before a checkpoint written behind has
        its files), sent through memory by the trainer's process
        (:func:`weight_sync.encoded`), taken in place of reading the checkpoint: into the policy
        (``hf``) or the backend's own weights (``vllm``:
        :meth:`~mage.backends.base.Backend.take_weights`), then checked: the probe's log-probs
        must equal the trainer's ``expected`` (else
        :class:`~mage.backends.weight_sync.StaleWeightsError`). A worker with no engine yet takes
        nothing: it builds from the checkpoint when first asked to play. Returns the check's
        largest gap and the seconds taken ({} when nothing was taken)."""
        if self._backend is None:
            return {}
        started = time.perf_counter()
        self._held = _UNCHECKED  # until checked: a failed push is never trusted, not even as the starting policy
        what = f"the weights of {checkpoint}, pushed through memory"
        if self._policy is not None:  # hf: into the model the backend samples with
            self._policy.model.load_state_dict(dict(weight_sync.decoded(chunks)), strict=True)
            tolerance = weight_sync.tolerance_for(self.settings.model.dtype)
            gap = weight_sync.check_gap(probe_logprobs(self._policy, probe), expected, tolerance, what)
        else:  # a backend with weights of its own; one with none (scripted) raises TypeError
            backend = self._backend
            backend.take_weights(chunks)
            gap = backend.check_weights(probe, expected, what)
            backend.name_weights(checkpoint)
        self._held = weights
        self.pushes += 1
        return {"gap": gap, "seconds": time.perf_counter() - started}

    def _build(self, loaded: ckpt.Checkpoint | None) -> Backend:
        if not samples_from_a_given_model(self.settings.engine):
            return rollout_backend(self.settings, checkpoint=loaded)
        # A fresh LoRA adapter is drawn from torch's global generator: seeded as the trainer
        # seeds it (start_training), the starting policy is the trainer's.
        torch.manual_seed(self.settings.train.seed)
        self._policy = load_run_policy(self.settings, loaded, trainable=False)
        return rollout_backend(self.settings, policy=self._policy)

    def close(self) -> None:
        """Release the engine, the policy and the league's snapshots (a vLLM engine stays for
        the process's next user)."""
        if self._backend is not None:
            self._backend.release()
        self._backend, self._policy, self._held = None, None, None
        self.snapshots.release()
