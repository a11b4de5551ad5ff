"""The league's snapshots as one player plays them: a backend per snapshot, loaded the first
time it plays and kept while it stays in the league.

The player owns them: the trainer's :class:`~mage.run.state.TrainingState` or a
:class:`~mage.run.worker.RolloutWorker` holds a :class:`LeagueSnapshots`, hands it to
:func:`mage.run.steps.rollout`, and releases it when it closes. Owned so, two players in one
process never release each other's snapshots, and nothing outlives the player that loaded it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mage.backends import Backend
from mage.models import checkpoint as ckpt
from mage.models.policy import rollout_backend
from mage.population.league import Member
from mage.settings import Settings


class LeagueSnapshots:
    """The backends of the league snapshots one player plays, by checkpoint folder and content
    hash (a folder written again holds other weights). Frozen, a snapshot only plays."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._backends: dict[tuple[str, str], Backend] = {}

    def backends(self, root: Path, members: Iterable[Member]) -> dict[str, Backend]:
        """A backend per league snapshot (its checkpoint under the run folder ``root``), by member
        id; those of snapshots that left the league are released."""
        wanted = {(str(root / m.checkpoint), ckpt.content_hash(root / m.checkpoint)): m for m in members}
        for key in [key for key in self._backends if key not in wanted]:
            self._backends.pop(key).release()
        for key in wanted:
            if key not in self._backends:
                self._backends[key] = rollout_backend(self.settings, checkpoint=ckpt.Checkpoint.at(key[0]))
        return {member.id: self._backends[key] for key, member in wanted.items()}

    def release(self) -> None:
        """Release every snapshot's backend (the player is done with them)."""
        while self._backends:
            self._backends.popitem()[1].release()
