"""A stop asked of this process's running work, for the loops that run on worker threads.

Python delivers a signal only to the main thread, and no thread can be interrupted by another:
a rollout shard playing on a task runner's thread would run to its end after SIGTERM or SIGINT,
and the flow, which waits for its threads before it records its final state, with it. So the
flows ask (:func:`request`) when the block that runs their tasks fails or is stopped, and the
long loops on threads (:class:`mage.rollout.RolloutEngine`, the wait for a Ray actor's shard)
look (:func:`check`) between steps, ending within a step with :class:`StopRequested`. The ask is
cleared (:func:`clear`) once those threads have ended, so the next run in the process (a
notebook's, a test's) starts clean.
"""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()


class StopRequested(Exception):
    """The work was asked to stop (:func:`request`): not a failure of its own, never retried."""

    transient = False  # tasks.caching.is_transient takes an error at its word


def request() -> None:
    """Ask every loop that checks to end at its next step."""
    _REQUESTED.set()


def clear() -> None:
    """Withdraw the ask (the threads it was meant for have ended)."""
    _REQUESTED.clear()


def requested() -> bool:
    """Whether a stop was asked and not withdrawn."""
    return _REQUESTED.is_set()


def check() -> None:
    """Raise :class:`StopRequested` if a stop was asked."""
    if _REQUESTED.is_set():
        raise StopRequested("stopped: the run was asked to stop (a stop signal, or another task's failure)")
