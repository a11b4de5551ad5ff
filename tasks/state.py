"""The training state kept in memory between tasks of one worker process.

A flow hands the policy from task to task as a checkpoint reference. Reloading the model,
the reference policy and the optimizer from disk for every task would cost more than a
tiny-preset iteration, so each process keeps its newest :class:`TrainingState` and reuses
it when a task asks for exactly the checkpoint it holds (same config, same content hash);
anything else is loaded from the checkpoint's files. Either way the task sees the same
weights, optimizer moments and RNG state, so caching changes speed, never results.
"""

from __future__ import annotations

import threading

from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.loop import TrainingState, start_training
from tasks.refs import FileRef

#: Serialises work on the shared state: rollout shards submitted to a thread pool take turns
#: on one in-memory model (use the process runner to spread shards over devices).
LOCK = threading.RLock()
_STATE: dict[str, TrainingState] = {}


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


def forget() -> None:
    """Drop the held state (tests; freeing GPU memory between flows)."""
    with LOCK:
        _STATE.clear()
