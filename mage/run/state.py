"""What a run holds in memory between iterations: the policy, its trainer and the checkpoint
it equals (:class:`TrainingState`), and, for rollouts in other processes, a
:class:`RolloutWorker` that samples from checkpoints on disk.

Whichever samples, the trainer's policy in memory or a worker given the same checkpoint,
the same iteration and shard play the same table.

A vLLM engine in the trainer's process gets each update's full weights through memory
(``engine.vllm.weight_sync=memory``), a LoRA adapter or, with ``disk``, full weights from the
checkpoint; either way its log-probs of a small probe must then equal the trainer's
(:mod:`mage.backends.vllm_sync`), or the run stops with a ``StaleWeightsError``. A rollout
worker in another process takes full weights sent to it the same way, checked the same way
(:meth:`RolloutWorker.take_weights`; on Ray, ``tasks.ray_workers.push_weights``).

A checkpoint that nothing reads before the next update is written behind
(:meth:`TrainingState.write_behind`): on a thread of its own while the next rollout plays from
the weights in memory. The update, the next checkpoint and the end of the run wait for it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import torch

from mage.backends import Backend, vllm_sync
from mage.backends.vllm import VLLMBackend
from mage.models.policy import Policy, load_run_policy, rollout_backend, teacher_forced
from mage.rollout import read_trajectories
from mage.run.layout import RunLayout
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train import sharded
from mage.train.trainer import PolicyTrainer

logger = logging.getLogger(__name__)

#: Beside the checkpoints: the sharded state written from a one-process checkpoint that a run
#: continues on ``train.workers`` > 1 workers (``TrainingState.workers_resume``).
WORKERS_RESUME = ".workers-resume-{iteration:05d}"


@dataclass
class TrainingState:
    """The policy and its trainer after ``iteration`` iterations; ``checkpoint`` is the newest
    checkpoint written or loaded (it equals the weights when ``iteration`` is its iteration)."""

    settings: Settings
    policy: Policy
    trainer: PolicyTrainer
    iteration: int = 0
    checkpoint: ckpt.Checkpoint | None = None
    _backend: Backend | None = field(default=None, repr=False)
    #: ``train.workers`` > 1: the workers' sharded state of the newest update, which the next
    #: checkpoint takes (the trainer in this process holds the weights, not the optimizer)
    sharded_state: Path | None = None
    #: ``train.workers`` > 1 resuming a one-process checkpoint: the sharded state written from it,
    #: which the workers' first update continues instead (removed once that update is done)
    workers_resume: Path | None = None
    _probe: vllm_sync.Probe | None = field(default=None, repr=False)  # what a vLLM engine is checked on
    #: a checkpoint written behind: its write on the writer thread
    _writing: concurrent.futures.Future | None = field(default=None, repr=False)
    _writer: concurrent.futures.ThreadPoolExecutor | None = field(default=None, repr=False)
    #: a checkpoint written behind that failed twice: raised by every wait until :meth:`close`
    _write_failed: BaseException | None = field(default=None, repr=False)

    def backend(self) -> Backend:
        """The rollout backend of the current weights (hf shares the policy's model in memory;
        vllm serves the newest checkpoint, which with vllm is written every iteration)."""
        if self._backend is None:
            self._backend = rollout_backend(self.settings, self.policy, self.checkpoint)
        return self._backend

    @contextlib.contextmanager
    def engine_asleep(self) -> Iterator[None]:
        """Inside, an engine of this process gives its accelerator memory to the trainer
        (vLLM's sleep mode; a no-op elsewhere)."""
        if self._backend is None:
            yield
            return
        self._backend.sleep()
        try:
            yield
        finally:
            self._backend.wake_up()

    def synced(self, table: pl.DataFrame) -> dict[str, float]:
        """The weights changed (an update on ``table``): a vLLM engine of this process that takes
        them through memory (``engine.vllm.weight_sync=memory``, full fine-tuning) gets them now,
        checked against the trainer; returns the largest log-prob gap of that check, or {}."""
        backend = self._backend
        if not isinstance(backend, VLLMBackend):
            return {}
        self.probe(table)
        if backend.weight_sync != "memory" or self.policy.is_lora:
            return {}  # the checkpoint brings them (checkpointed)
        pushed = vllm_sync.push_weights(backend, self.policy.model.state_dict().items())
        gap = self._verify(backend, f"the weights of update {self.iteration}, pushed through memory")
        logger.info(f"weights of update {self.iteration} in the vLLM engine through memory: {pushed['tensors']} "
                    f"tensors in {pushed['seconds']:.2f} s, probe log-probs within {gap:.1e} of the trainer's")
        return {"weight_sync_gap_max": gap}

    def probe(self, table: pl.DataFrame | Path) -> vllm_sync.Probe:
        """What engines are checked on: a few rows of ``table`` (or of the trajectory file
        ``table``, read only while there is no probe yet), fixed from the first table on."""
        if self._probe is None:
            frame = read_trajectories(table) if isinstance(table, Path) else table
            self._probe = vllm_sync.probe_from(frame["prompt_token_ids"].to_list(),
                                               frame["response_token_ids"].to_list())
        return self._probe

    def checkpointed(self, saved: ckpt.Checkpoint) -> None:
        """``saved`` holds the current weights: the rollouts go on with it (a vLLM engine that was
        pushed them takes it as their name; any other loads it, and is checked)."""
        self.checkpoint = saved
        backend = self._backend
        if backend is None:
            return
        if isinstance(backend, VLLMBackend) and vllm_sync.name_pushed(backend, str(saved.path)):
            return
        backend.load_checkpoint(saved.path, saved.kind)
        if isinstance(backend, VLLMBackend) and self._probe is not None:
            self._verify(backend, f"checkpoint {saved.path}")

    def _verify(self, backend: VLLMBackend, what: str) -> float:
        assert self._probe is not None
        tolerance = vllm_sync.engine_tolerance(backend)
        return vllm_sync.verify(backend, self._probe, probe_logprobs(self.policy, self._probe), tolerance, what)

    def write_behind(self, write: Callable[[], ckpt.Checkpoint]) -> None:
        """Run ``write`` (the files of checkpoint ``self.checkpoint``; it returns the checkpoint
        with them) on the writer thread, after the write before it. The weights and the
        optimizer state must not change until :meth:`wait_for_checkpoint`."""
        self.wait_for_checkpoint()
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._writing = self._writer.submit(self._write_twice, self.checkpoint, write)

    @staticmethod
    def _write_twice(checkpoint: ckpt.Checkpoint, write: Callable[[], ckpt.Checkpoint]) -> ckpt.Checkpoint:
        """On the writer thread: ``write``, made once more if it fails (the weights have not
        changed since: a refused write is retried as the save step's task would retry it). A
        second failure is marked beside the checkpoints, so that a reader in another process
        (a restarted rollout worker) stops waiting for it, and raised at the next wait."""
        try:
            return write()
        except Exception as error:  # noqa: BLE001 - written again; a second failure is raised
            logger.warning(f"checkpoint {checkpoint.path}, written behind, failed ({error}); writing it again")
        try:
            return write()
        except Exception:
            ckpt.mark_unwritten(checkpoint)
            raise

    def wait_for_checkpoint(self) -> None:
        """The checkpoint written behind, if any, is on disk when this returns. Its write's
        second failure is raised here, and by every later wait (a retried step finds the
        checkpoint missing still); the run resumes from the checkpoint before it."""
        if self._write_failed is not None:
            raise self._write_failed
        if self._writing is None:
            return
        started = time.perf_counter()
        try:
            written = self._writing.result()
        except Exception as error:
            self._writing, self._write_failed = None, error
            raise
        self._writing = None  # only now: stopped while waiting, close() waits again
        if (waited := time.perf_counter() - started) >= 1:  # the rollout was shorter than the write
            logger.info(f"waited {waited:.1f} s for checkpoint {written.path}")
        if self.checkpoint is not None and self.checkpoint.path == written.path:
            self.checkpoint = written  # with its files in the manifest

    def close(self) -> None:
        """Wait for a checkpoint written behind (a failed write is logged: the run is ending,
        and resumes from the checkpoint before it), then release the engine."""
        try:
            self.wait_for_checkpoint()
        except Exception as error:  # noqa: BLE001 - the run is ending; this is its last word on the write
            logger.error(f"a checkpoint written behind failed: {error}")
        finally:
            self._writing, self._write_failed = None, None
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None
            self._release()

    def _release(self) -> None:
        if self._backend is not None:
            self._backend.release()
        self._backend = None
        release_snapshots()
        if self.workers_resume is not None:  # not used by an update: the next start writes it again
            shutil.rmtree(self.workers_resume, ignore_errors=True)
            self.workers_resume = None


def probe_logprobs(policy: Policy, probe: vllm_sync.Probe) -> list[list[float]]:
    """The policy's teacher-forced log-probs (temperature 1) of each probe sequence's scored tokens."""
    return teacher_forced(policy.model, probe.tokens, probe.scored, policy.autocast())


def start_training(settings: Settings, checkpoint: ckpt.Checkpoint | None = None) -> TrainingState:
    """A training state at ``checkpoint`` (weights, optimizer and RNG state), or at the start."""
    if settings.train.deterministic:
        from transformers.trainer_utils import enable_full_determinism

        enable_full_determinism(settings.train.seed)
    # A fresh LoRA adapter is drawn from torch's global generator: seed it, so a run's
    # starting point depends on its seed alone, not on what the process ran before.
    torch.manual_seed(settings.train.seed)
    # The trainer is built on the base weights (full fine-tuning copies them as the
    # reference policy); a checkpoint's weights are loaded into the policy afterwards.
    # With train.workers > 1 the workers train on their own devices; this process holds the
    # weights only to write checkpoints and hand them on, in host memory (its GPUs are the cluster's)
    policy = load_run_policy(settings if settings.train.workers == 1 else
                             replace(settings, model=replace(settings.model, device="cpu")))
    trainer = PolicyTrainer(policy, settings.train, settings.algo, temperature=settings.engine.sampling.temperature)
    if checkpoint is not None:
        ckpt.load_weights(policy, checkpoint)
        if checkpoint.sharded and settings.train.workers == 1:  # written by N workers, continued in one process
            sharded.load_state(trainer, checkpoint.path)
        elif not checkpoint.sharded:
            ckpt.load_trainer_state(checkpoint, trainer.optimizer)
        ckpt.load_rng(checkpoint)
    state = TrainingState(settings, policy, trainer, checkpoint.iteration if checkpoint else 0, checkpoint)
    checkpoints = RunLayout.of(settings).checkpoints
    for earlier in checkpoints.glob(WORKERS_RESUME.partition("{")[0] + "*"):
        shutil.rmtree(earlier, ignore_errors=True)  # an earlier start's, whatever it resumed
    if checkpoint is not None and not checkpoint.sharded and settings.train.workers > 1 \
            and checkpoint.iteration < settings.train.iterations:
        # written by one process, continued on workers: they read a sharded state, written here
        # once from the state this process just loaded (any number of ranks reads it back)
        state.workers_resume = sharded.write_state(trainer, checkpoints / WORKERS_RESUME.format(
            iteration=checkpoint.iteration)).parent
        # the workers hold the optimizer from here on: this process steps none (AdamW's moments
        # are twice the weights); a checkpoint takes the workers' sharded state instead
        trainer.optimizer.state.clear()
    return state


#: What a rollout worker holds while pushed weights are being checked: no checkpoint's.
_UNCHECKED = "unchecked pushed weights"


class RolloutWorker:
    """A generation engine and the policy it samples from, kept between iterations, for
    rollouts outside the trainer's process (a process pool's worker, a Ray actor). It holds
    no trainer: each iteration names the checkpoint to sample from by path, and the worker
    loads it only when it differs from the one it holds (a LoRA adapter or full weights into
    its own copy of the model with ``hf``, or into its engine with ``vllm``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._backend: Backend | None = None
        self._policy: Policy | None = None  # hf only: the weights the backend samples with
        self._held: str | None = None  # the weights_id of the checkpoint held (None: the starting policy)
        self.loads = self.pushes = 0  # checkpoints read from disk, and weights taken through memory

    def sample_from(self, checkpoint: str | Path | None, weights: str | None = None) -> Backend:
        """The engine, sampling from ``checkpoint`` (None: the run's starting policy). Given its
        ``weights`` (:func:`mage.train.checkpoint.weights_id`), a worker that was pushed them
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

    def take_weights(self, checkpoint: str, weights: str, chunks: Iterable[list[vllm_sync.Encoded]],
                     probe: vllm_sync.Probe, expected: list[list[float]]) -> dict[str, Any]:
        """The full weights of ``checkpoint`` (named ``weights``: its
        :func:`~mage.train.checkpoint.weights_id`, known before a checkpoint written behind has
        its files), sent through memory by the trainer's process
        (:func:`vllm_sync.encoded`), taken in place of reading the checkpoint: into the engine
        (``vllm``) or the policy (``hf``), then checked: the probe's log-probs must equal the
        trainer's ``expected`` (else :class:`~mage.backends.vllm_sync.StaleWeightsError`). A worker
        with no engine yet takes nothing: it builds from the checkpoint when first asked to play.
        Returns the check's largest gap and the seconds taken ({} when nothing was taken)."""
        if self._backend is None:
            return {}
        started = time.perf_counter()
        self._held = _UNCHECKED  # until checked: a failed push is never trusted, not even as the starting policy
        what = f"the weights of {checkpoint}, pushed through memory"
        if self._policy is not None:  # hf: into the model the backend samples with
            self._policy.model.load_state_dict(dict(vllm_sync.decoded(chunks)), strict=True)
            tolerance = vllm_sync.tolerance_for(self.settings.model.dtype)
            gap = vllm_sync.check_gap(probe_logprobs(self._policy, probe), expected, tolerance, what)
        elif isinstance(self._backend, VLLMBackend):
            backend = self._backend
            vllm_sync.push_encoded(backend, chunks)
            tolerance = vllm_sync.engine_tolerance(backend)
            gap = vllm_sync.verify(backend, probe, expected, tolerance, what)
            vllm_sync.name_pushed(backend, checkpoint)
        else:
            raise TypeError(f"a {type(self._backend).__name__} takes no weights through memory")
        self._held = weights
        self.pushes += 1
        return {"gap": gap, "seconds": time.perf_counter() - started}

    def _build(self, loaded: ckpt.Checkpoint | None) -> Backend:
        if self.settings.engine.backend != "hf":
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
        release_snapshots()


# -- the league's snapshots, as this process plays them ----------------------------------------
#: The backends of league snapshots this process plays, by checkpoint folder and content hash.
_SNAPSHOTS: dict[tuple[str, str], Backend] = {}


def snapshot_backends(settings: Settings, root: Path, members: Iterable[Any]) -> dict[str, Backend]:
    """A backend per league snapshot (``mage.league.Member``; its checkpoint under the run
    folder ``root``), loaded once per process: frozen, it only plays. Those of snapshots that
    left the league are released."""
    wanted = {(str(root / m.checkpoint), ckpt.content_hash(root / m.checkpoint)): m for m in members}
    for key in [key for key in _SNAPSHOTS if key not in wanted]:
        _SNAPSHOTS.pop(key).release()
    for key in wanted:
        if key not in _SNAPSHOTS:
            _SNAPSHOTS[key] = rollout_backend(settings, checkpoint=ckpt.Checkpoint.at(key[0]))
    return {member.id: _SNAPSHOTS[key] for key, member in wanted.items()}


def release_snapshots() -> None:
    """Release every snapshot's backend (the run or the worker is done with them)."""
    while _SNAPSHOTS:
        _SNAPSHOTS.popitem()[1].release()
