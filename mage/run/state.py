"""What a run holds in memory between iterations (:class:`TrainingState`): the policy, its
trainer and the checkpoint it equals, the backend that samples from it, and what that backend
plays against (the league's snapshots, :mod:`mage.run.snapshots`). Rollouts in other processes
sample from checkpoints with a :class:`~mage.run.worker.RolloutWorker` instead; whichever
samples, the same iteration and shard play the same table.

A backend with weights of its own (a vLLM engine in the trainer's process) gets each update's
through memory (``engine.vllm.weight_sync=memory``, full fine-tuning) or, with a LoRA adapter or
``disk``, from the checkpoint; either way its log-probs of a small probe must then equal the
trainer's (:meth:`~mage.backends.base.Backend.check_weights`), or the run stops with a
``StaleWeightsError``. Which backend it is, this module never asks: the backend's hooks say
(:attr:`~mage.backends.base.Backend.weight_sync`).

A checkpoint that nothing reads before the next update is written behind
(:meth:`TrainingState.write_behind`, on the state's :class:`~mage.run.writer.CheckpointWriter`):
the update, the next checkpoint and the end of the run wait for it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl
import torch

from mage.backends import Backend, weight_sync
from mage.models import checkpoint as ckpt
from mage.models.policy import Policy, load_run_policy, rollout_backend
from mage.rollout import read_trajectories
from mage.run.layout import RunLayout
from mage.run.snapshots import LeagueSnapshots
from mage.run.writer import CheckpointWriter
from mage.settings import Settings
from mage.tensors import teacher_forced
from mage.trainer import sharded
from mage.trainer.policy_trainer import PolicyTrainer

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
    #: what a backend with weights of its own is checked on
    _probe: weight_sync.Probe | None = field(default=None, repr=False)
    #: writes checkpoints behind (:meth:`write_behind`)
    writer: CheckpointWriter = field(default_factory=CheckpointWriter, repr=False)
    #: the league's snapshots, as this state's rollouts play them (released by :meth:`close`)
    snapshots: LeagueSnapshots = field(init=False, repr=False)
    #: ``train.max_staleness`` > 0: a copy of the weights that rollouts play on while an update
    #: changes the trainer's (:meth:`sync_behind`), and the backend sampling from it
    _behind_model: torch.nn.Module | None = field(default=None, repr=False)
    _behind: Backend | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.snapshots = LeagueSnapshots(self.settings)

    def backend(self) -> Backend:
        """The rollout backend of the current weights (hf shares the policy's model in memory;
        vllm serves the newest checkpoint, which with vllm is written every iteration)."""
        if self._backend is None:
            self._backend = rollout_backend(self.settings, self.policy, self.checkpoint)
        return self._backend

    def sync_behind(self) -> None:
        """The copy that rollouts play on behind the update takes the trainer's weights as they
        are now (made on the first call: the model's size again in memory). Called between
        rollouts, never while one plays on the copy."""
        with torch.no_grad():
            if self._behind_model is None:
                self._behind_model = copy.deepcopy(self.policy.model).requires_grad_(False).eval()
            else:
                self._behind_model.load_state_dict(self.policy.model.state_dict())

    def backend_behind(self) -> Backend:
        """The rollout backend of the copy :meth:`sync_behind` last set (the hf backend: the
        settings refuse the others with ``train.max_staleness`` > 0)."""
        if self._behind_model is None:
            raise RuntimeError("sync_behind() first: there is no copy of the weights to play on")
        if self._behind is None:
            self._behind = rollout_backend(self.settings, replace(self.policy, model=self._behind_model), self.checkpoint)
        return self._behind

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
        """The weights changed (an update on ``table``): a backend of this process with weights of
        its own that takes them through memory (``engine.vllm.weight_sync=memory``, full
        fine-tuning) gets them now, checked against the trainer; returns the largest log-prob gap
        of that check, or {}."""
        backend = self._backend
        if backend is None or backend.weight_sync is None:
            return {}  # no backend yet, or one that samples with the trainer's model
        self.probe(table)
        if backend.weight_sync != "memory" or self.policy.is_lora:
            return {}  # the checkpoint brings them (checkpointed)
        pushed = backend.take_weights(weight_sync.encoded(self.policy.model.state_dict().items()))
        gap = self._verify(backend, f"the weights of update {self.iteration}, pushed through memory")
        logger.info(f"weights of update {self.iteration} in the vLLM engine through memory: {pushed['tensors']} "
                    f"tensors in {pushed['seconds']:.2f} s, probe log-probs within {gap:.1e} of the trainer's")
        return {"weight_sync_gap_max": gap}

    def probe(self, table: pl.DataFrame | Path) -> weight_sync.Probe:
        """What engines are checked on: a few rows of ``table`` (or of the trajectory file
        ``table``, read only while there is no probe yet), fixed from the first table on."""
        if self._probe is None:
            frame = read_trajectories(table) if isinstance(table, Path) else table
            self._probe = weight_sync.probe_from(frame["prompt_token_ids"].to_list(),
                                               frame["response_token_ids"].to_list())
        return self._probe

    def checkpointed(self, saved: ckpt.Checkpoint) -> None:
        """``saved`` holds the current weights: the rollouts go on with it (a backend that was
        pushed them takes it as their name; any other loads it, and one with weights of its own
        is checked)."""
        self.checkpoint = saved
        backend = self._backend
        if backend is None:
            return
        if backend.name_weights(str(saved.path)):
            return
        backend.load_checkpoint(saved.path, saved.kind)
        if backend.weight_sync is not None and self._probe is not None:
            self._verify(backend, f"checkpoint {saved.path}")

    def _verify(self, backend: Backend, what: str) -> float:
        assert self._probe is not None
        return backend.check_weights(self._probe, probe_logprobs(self.policy, self._probe), what)

    def write_behind(self, write: Callable[[], ckpt.Checkpoint]) -> None:
        """Run ``write`` (the files of checkpoint ``self.checkpoint``; it returns the checkpoint
        with them) on the writer thread, after the write before it. The weights and the
        optimizer state must not change until :meth:`wait_for_checkpoint`."""
        assert self.checkpoint is not None
        self.writer.write(self.checkpoint, write)

    def wait_for_checkpoint(self) -> None:
        """The checkpoint written behind, if any, is on disk when this returns. Its write's
        second failure is raised here, and by every later wait (a retried step finds the
        checkpoint missing still); the run resumes from the checkpoint before it."""
        written = self.writer.wait()
        if written is not None and self.checkpoint is not None and self.checkpoint.path == written.path:
            self.checkpoint = written  # with its files in the manifest

    def close(self) -> None:
        """Wait for a checkpoint written behind (a failed write is logged: the run is ending,
        and resumes from the checkpoint before it), then release the engine and the snapshots."""
        try:
            self.wait_for_checkpoint()
        except Exception as error:  # noqa: BLE001 - the run is ending; this is its last word on the write
            logger.error(f"a checkpoint written behind failed: {error}")
        finally:
            self.writer.close()
            self._release()

    def _release(self) -> None:
        for backend in (self._backend, self._behind):
            if backend is not None:
                backend.release()
        self._backend = self._behind = self._behind_model = None
        self.snapshots.release()
        if self.workers_resume is not None:  # not used by an update: the next start writes it again
            shutil.rmtree(self.workers_resume, ignore_errors=True)
            self.workers_resume = None


def probe_logprobs(policy: Policy, probe: weight_sync.Probe) -> list[list[float]]:
    """The policy's teacher-forced log-probs (temperature 1) of each probe sequence's scored tokens:
    what a backend's, or a rollout worker's, are checked against."""
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
