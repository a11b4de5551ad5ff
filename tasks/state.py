"""What a process keeps in memory between tasks: the training state and the rollout worker.

A flow hands the policy from task to task as a checkpoint reference. Reloading the model,
the reference policy and the optimizer from disk for every task would cost more than a
tiny-preset iteration, so each process keeps its newest :class:`TrainingState` and reuses
it when a task asks for exactly the checkpoint it holds (same config, same content hash);
anything else is loaded from the checkpoint's files. Either way the task sees the same
weights, optimizer moments and RNG state, so caching changes speed, never results.

Rollout tasks use a :class:`RolloutWorker` instead: the engine and the policy it samples
from, never the trainer. The process keeps one and it loads each new checkpoint by path,
as a Ray actor does on a cluster.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.loop import TrainingState, start_training
from mage.train.rollout_worker import RolloutWorker
from tasks.refs import FileRef

#: Serialises work on the shared state: rollout shards submitted to a thread pool take turns
#: on one in-memory model (use the process runner to spread shards over devices).
LOCK = threading.RLock()
_STATE: dict[str, TrainingState] = {}
_WORKER: dict[str, RolloutWorker] = {}


def state_key(settings: Settings) -> str:
    return settings.section_hash("model", "algo", "train", "engine", "seed", "run", "paths")


def training_state(settings: Settings, checkpoint: FileRef | None) -> TrainingState:
    """The state at ``checkpoint`` (None: the base model), from memory if it is the one held."""
    key = state_key(settings)
    wanted = checkpoint.sha256 if checkpoint is not None else None
    with LOCK:
        held = _STATE.get(key)
        if held is not None and held.checkpoint_hash == wanted:
            return held
        _STATE.clear()  # one model in memory at a time
        loaded = None
        if checkpoint is not None:
            path = checkpoint.resolve()
            loaded = ckpt.Checkpoint.at(path)
        state = start_training(settings, loaded)
        _STATE[key] = state
        return state


def worker_key(settings: Settings) -> str:
    return settings.section_hash("model", "engine", "game", "population", "seed", "run", "paths")


def rollout_worker(settings: Settings) -> RolloutWorker:
    """This process's rollout worker for ``settings`` (one at a time)."""
    key = worker_key(settings)
    with LOCK:
        if key not in _WORKER:
            forget_worker()
            _WORKER[key] = RolloutWorker(settings)
        return _WORKER[key]


@contextlib.contextmanager
def engine_asleep() -> Iterator[None]:
    """A trainer in the process that also holds the rollout engine gets the accelerator's
    memory (vLLM's sleep mode) while it updates."""
    with LOCK:
        workers = list(_WORKER.values())
        for worker in workers:
            worker.sleep()
        try:
            yield
        finally:
            for worker in workers:
                worker.wake_up()


def forget_worker() -> None:
    with LOCK:
        for worker in _WORKER.values():
            worker.close()
        _WORKER.clear()


def forget_training_state() -> None:
    with LOCK:
        _STATE.clear()


def forget() -> None:
    """Drop the held state and worker (tests; freeing memory between flows)."""
    with LOCK:
        forget_training_state()
        forget_worker()
