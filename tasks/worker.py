"""What a process keeps in memory between tasks: its rollout worker.

The train flow's loop holds the training state itself (``mage.run.loop``). A process that
plays rollout shards for it from checkpoints (a process pool's worker) keeps one
:class:`~mage.run.worker.RolloutWorker` and loads each new checkpoint by path, as a Ray actor
does on a cluster: the engine, the policy and the league's snapshots are loaded once per
process, not per iteration. A process-pool task has nowhere else to keep them between calls,
so this is the flows' one per-process cache (the other, vLLM's engine, is the backends':
DEVELOPERS.md, "Process-wide state").
"""

from __future__ import annotations

import threading

from mage.run.reads import READS
from mage.run.worker import RolloutWorker
from mage.settings import Settings

#: Serialises work on shared state: rollout shards submitted to a thread pool take turns on
#: one in-memory model (use the process or Ray runner to spread shards over devices).
LOCK = threading.RLock()
#: The same for the shards of a rollout behind the update (``train.max_staleness``): they take
#: turns on the copy of the weights they play on, while the update holds :data:`LOCK`
BEHIND_LOCK = threading.Lock()
#: This process's rollout worker and the hash of what its rollouts read (one at a time)
_WORKER: tuple[str, RolloutWorker] | None = None


def rollout_worker(settings: Settings) -> RolloutWorker:
    """This process's rollout worker for ``settings``: the one held while what a rollout reads
    is unchanged, else a new one (the old one is closed first)."""
    global _WORKER
    key = settings.hash_of(READS["rollout"])
    with LOCK:
        if _WORKER is None or _WORKER[0] != key:
            forget()
            _WORKER = (key, RolloutWorker(settings))
        return _WORKER[1]


def forget() -> None:
    """Close and drop the held worker (tests; freeing memory between flows)."""
    global _WORKER
    with LOCK:
        if _WORKER is not None:
            held, _WORKER = _WORKER[1], None
            held.close()
