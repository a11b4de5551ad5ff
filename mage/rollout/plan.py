"""The plan of a rollout: which meta-episodes it plays, each with its group, opponent entry,
seat and initial-state seed (the GiGPO groups of ``mage.algo``: a group's members share the
seed, the seat and, unless planned ``mixed``, the opponent)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mage.config.sections import PopulationEntry
from mage.tensors import derive_seed


@dataclass(frozen=True)
class MetaEpisodeSpec:
    """What one meta-episode plays: its ids, opponent entry, seat and initial-state seed."""

    meta_id: int
    group_id: int
    entry: PopulationEntry
    seat: int
    seed: int
    index_in_group: int = 0


def allocate_groups(shares: Sequence[float], num_groups: int, rng: np.random.Generator) -> list[int]:
    """Groups per entry by largest remainder (stratified, unlike independent draws). Shares are
    relative: a subset of a population (one opponent, in evaluation) gets all the groups."""
    weights = np.asarray(shares, dtype=float)
    quotas = weights / weights.sum() * num_groups
    counts = np.floor(quotas).astype(int)
    remainders = quotas - counts
    order = np.lexsort((rng.random(len(shares)), -remainders))  # ties broken at random
    for index in order[: num_groups - counts.sum()]:
        counts[index] += 1
    return counts.tolist()


def plan_meta_episodes(
    entries: Sequence[PopulationEntry],
    num_groups: int,
    group_size: int,
    seed: int,
    seat_split: float = 0.5,
    num_seats: int = 2,
    mixed: bool = False,
) -> list[MetaEpisodeSpec]:
    """Assign ``num_groups`` groups to entries by their shares, seats by ``seat_split``.

    Entries with no share (held-out opponents in evaluation) are weighted equally. With
    ``mixed`` (the ablation of stationary grouping) the shares deal meta-episodes instead of
    groups, in a random order: a group's members share the initial state and seat but not
    the opponent.
    """
    rng = np.random.default_rng(seed)
    shares = [e.share for e in entries]
    if sum(shares) <= 0:
        shares = [1.0 / len(entries)] * len(entries)
    # drawn under ``mixed`` too: the draws after it (the seats) stay those of the stationary plan
    counts = allocate_groups(shares, num_groups, rng)
    seats = np.zeros(num_groups, dtype=int)
    if num_seats > 1:
        seats[rng.permutation(num_groups)[: int(round(seat_split * num_groups))]] = 1
    if mixed:
        dealt = allocate_groups(shares, num_groups * group_size, rng)
        players = [entry for entry, count in zip(entries, dealt) for _ in range(count)]
        members = [players[i] for i in rng.permutation(len(players))]
    else:
        members = [entry for entry, count in zip(entries, counts) for _ in range(count * group_size)]
    specs = []
    for group, seat in enumerate(seats):
        group_seed = derive_seed(seed, group)
        for index in range(group_size):
            meta = group * group_size + index
            specs.append(MetaEpisodeSpec(meta, group, members[meta], int(seat), group_seed, index))
    return specs
