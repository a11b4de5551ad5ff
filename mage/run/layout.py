"""Where a run keeps its files: one definition of the layout, used by the library's loop, the
flows, the tasks and the benchmarks.

Under ``paths.runs/<run.name>``::

    run.json                          what the run is: the settings its iterations depend on
    checkpoints/ckpt-00002/ ...       train.checkpoint_every, the last iteration, and every evaluation
    rollouts/iteration-00001.parquet  each iteration's table, with returns and advantages
    rollouts/shards/iteration-00001-shard-000.parquet   a shard's table (rollouts in other processes,
                                      or played behind the update: train.max_staleness, with .stats.json)
    metrics.jsonl                     one line per iteration: what it computed (repeats bitwise)
    performance.jsonl                 one line per iteration: how fast, how much memory (this machine's)
    league.jsonl                      population.league: one line per iteration, the snapshots and ratings after it
    final.json                        the run's final checkpoint, once every iteration is done

Beside it, ``.<run.name>.lock`` (one writer at a time; DVC versions nothing there). Under
``paths.evaluations/<run.name>``: one folder of evaluation tables per checkpoint
(``ckpt-00002/``: :func:`evaluation_dir`) and the pipeline's ``final/``; the starting
policy's is ``paths.start_evaluation``. Each game held out at evaluation (``eval.games``) has
its tables in a folder of its name inside these (:func:`held_out_dir`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mage import io
from mage.models import checkpoint as ckpt
from mage.settings import Settings

logger = logging.getLogger(__name__)
#: The runs whose lock this process holds.
_HELD: set[str] = set()


def evaluation_dir(settings: Settings, checkpoint: str | Path | None) -> Path:
    """Where a checkpoint's evaluation tables go, ``paths.evaluations/<run.name>/<ckpt-name>``
    (None: the starting policy's, ``paths.start_evaluation``)."""
    if checkpoint is None:
        return Path(settings.paths.start_evaluation)
    return Path(settings.paths.evaluations) / settings.run_name / Path(checkpoint).name


def held_out_dir(directory: str | Path, game: str) -> Path:
    """Where the tables of ``game``, held out at evaluation (``eval.games``), go beside an
    evaluation's own in ``directory``: ``<directory>/<game>``."""
    return Path(directory) / game


@dataclass(frozen=True)
class RunLayout:
    root: Path  # paths.runs/<run.name>

    @classmethod
    def of(cls, settings: Settings, run: str | None = None) -> RunLayout:
        """The layout of ``run`` (default: the configured ``run.name``)."""
        return cls(Path(settings.paths.runs) / (run or settings.run_name))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def identity(self) -> Path:
        return self.root / "run.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def performance(self) -> Path:
        return self.root / "performance.jsonl"

    @property
    def league(self) -> Path:
        return self.root / "league.jsonl"

    @property
    def final(self) -> Path:
        return self.root / "final.json"

    def checkpoint(self, iteration: int) -> Path:
        """Where the checkpoint after ``iteration`` is (or will be) written."""
        return self.checkpoints / f"{ckpt.PREFIX}{iteration:05d}"

    @property
    def lock(self) -> Path:
        return self.root.parent / f".{self.root.name}.lock"

    def rollout(self, iteration: int) -> Path:
        return self.rollouts / f"iteration-{iteration:05d}.parquet"

    def rollout_shard(self, iteration: int, shard: int) -> Path:
        return self.rollouts / "shards" / f"iteration-{iteration:05d}-shard-{shard:03d}.parquet"

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One writer per run: hold the run's lock (beside the run directory, so nothing
        versions it), then clear what a killed writer left behind (temporary checkpoint
        directories and files). A second writer stops at once with the holder's pid. Within
        one process it nests (the train flow takes it before it starts workers, then the loop)."""
        key = str(self.lock.resolve())
        if key in _HELD:
            yield
            return
        with io.exclusive_lock(self.lock, f"run {self.name!r}"):
            _HELD.add(key)
            try:
                for path in io.remove_stale_temporaries(self.root):
                    logger.warning(f"removed {path}: left by an interrupted write")
                yield
            finally:
                _HELD.discard(key)

    # -- the final checkpoint --------------------------------------------------------------
    def write_final(self, checkpoint: ckpt.Checkpoint | None, iterations: int) -> Path:
        """``final.json``: the run's final checkpoint, relative to the run's directory (a run
        copied or moved elsewhere still names its own checkpoint), its content hash and the
        number of iterations."""
        recorded = os.path.relpath(checkpoint.path, self.root) if checkpoint is not None else None
        return io.write_json(self.final, {"checkpoint": recorded, "iterations": iterations,
                                          "sha256": ckpt.content_hash(checkpoint.path) if checkpoint else None})

    def final_checkpoint(self) -> Path | None:
        """The run's final checkpoint (``final.json``), else its latest complete one, else None.
        A ``final.json`` that cannot be read, or whose checkpoint is gone, is warned about and
        the latest complete checkpoint stands in; a final checkpoint that is there is returned
        as it is, damaged or not (the caller's check names what is wrong)."""
        if self.final.is_file():
            try:
                recorded: Any = io.read_json(self.final)["checkpoint"]
            except (io.CorruptFileError, KeyError, TypeError) as error:
                logger.warning(f"{self.final}: unreadable ({error}); using the run's latest complete checkpoint instead")
                recorded = None
            # Relative to the run's directory; files written before that hold the path as the run
            # was given it (absolute, or relative to the working directory).
            candidates = [self.root / recorded, Path(recorded)] if isinstance(recorded, str) and recorded else []
            found = next((path for path in candidates if path.is_dir()), None)
            if found:
                return found
            if candidates:
                logger.warning(f"{self.final}: its checkpoint {recorded} is gone; using the run's latest complete "
                               "checkpoint instead")
        latest = ckpt.latest_checkpoint(self.checkpoints)
        return latest.path if latest else None
