"""What a process keeps in memory between tasks: its rollout worker.

The train flow's loop holds the training state itself (``mage.run.loop``). A process that
plays rollout shards for it from checkpoints (a process pool's worker) keeps one
:class:`~mage.run.state.RolloutWorker` and loads each new checkpoint by path, as a Ray actor
does on a cluster: the engine is built once per process, not per iteration.
"""

from __future__ import annotations

import threading

from mage.run.reads import READS
from mage.run.state import RolloutWorker
from mage.settings import Settings

#: Serialises work on shared state: rollout shards submitted to a thread pool take turns on
#: one in-memory model (use the process or Ray runner to spread shards over devices).
LOCK = threading.RLock()
_WORKER: dict[str, RolloutWorker] = {}


def rollout_worker(settings: Settings) -> RolloutWorker:
    """This process's rollout worker for ``settings`` (one at a time, keyed by what a rollout reads)."""
    key = settings.hash_of(READS["rollout"])
    with LOCK:
        if key not in _WORKER:
            forget()
            _WORKER[key] = RolloutWorker(settings)
        return _WORKER[key]


def forget() -> None:
    """Drop the held worker (tests; freeing memory between flows)."""
    with LOCK:
        for worker in _WORKER.values():
            worker.close()
        _WORKER.clear()
