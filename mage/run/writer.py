"""A checkpoint written behind: its files written on a thread of their own while the next
rollout plays from the weights in memory (``train.write_behind``,
:func:`mage.run.loop.writes_behind`).

One write at a time, in order. A refused write is made once more (the weights have not changed
since, as the save step's task would retry it); a second failure is marked beside the
checkpoints, so that a reader in another process (a restarted rollout worker) stops waiting for
it, and is raised by every wait until :meth:`CheckpointWriter.close`. The trainer's state
(:class:`~mage.run.state.TrainingState`) holds the writer: the update, the next checkpoint and
the end of the run wait for it there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable

from mage.models import checkpoint as ckpt

logger = logging.getLogger(__name__)


class CheckpointWriter:
    """The thread that writes checkpoints behind, and the write it is making."""

    def __init__(self) -> None:
        self._writing: concurrent.futures.Future | None = None  # the write on the thread, if any
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None  # started by the first write
        #: a write that failed twice: raised by every wait until :meth:`close`
        self._failed: BaseException | None = None

    def write(self, checkpoint: ckpt.Checkpoint, write: Callable[[], ckpt.Checkpoint]) -> None:
        """Run ``write`` (the files of ``checkpoint``; it returns the checkpoint with them) on the
        writer thread, once the write before it is done (:meth:`wait`: its failure is raised
        here, and this one is not made)."""
        self.wait()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._writing = self._executor.submit(self._write_twice, checkpoint, write)

    @staticmethod
    def _write_twice(checkpoint: ckpt.Checkpoint, write: Callable[[], ckpt.Checkpoint]) -> ckpt.Checkpoint:
        """On the writer thread: ``write``, made once more if it fails; a second failure is
        marked for readers elsewhere (:func:`mage.models.checkpoint.mark_unwritten`) and raised."""
        try:
            return write()
        except Exception as error:  # noqa: BLE001 - written again; a second failure is raised
            logger.warning(f"checkpoint {checkpoint.path}, written behind, failed ({error}); writing it again")
        try:
            return write()
        except Exception:
            ckpt.mark_unwritten(checkpoint)
            raise

    def wait(self) -> ckpt.Checkpoint | None:
        """The checkpoint written behind, on disk (with its files in the manifest), or None when
        none was being written. A write's second failure is raised here, and by every later
        wait (a retried step finds the checkpoint missing still)."""
        if self._failed is not None:
            raise self._failed
        if self._writing is None:
            return None
        started = time.perf_counter()
        try:
            written = self._writing.result()
        except Exception as error:
            self._writing, self._failed = None, error
            raise
        self._writing = None  # only now: stopped while waiting, the next wait waits again
        if (waited := time.perf_counter() - started) >= 1:  # the rollout was shorter than the write
            logger.info(f"waited {waited:.1f} s for checkpoint {written.path}")
        return written

    def close(self) -> None:
        """Forget the write and its failure, and end the thread (after the owner's last :meth:`wait`)."""
        self._writing, self._failed = None, None
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
