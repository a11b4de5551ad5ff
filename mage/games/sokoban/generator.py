"""Random Sokoban levels by reverse play, in the manner of gym-sokoban.

Each attempt carves a connected room, puts the boxes on their targets and then plays
*backwards*: the player wanders and now and then pulls a box (the reverse of a push).
Undoing those steps solves the level, so every candidate is solvable by construction; the
optimal solver then measures its true difficulty (shortest solution in single moves) and
the candidate is kept only if that length is in the requested range.

All randomness comes from one ``np.random.default_rng(seed)``, consumed in a fixed order,
so a seed always gives the same level (for a given numpy version and settings). Rejected
attempts simply move on to the rng's next draws.

Measured on 6x6 rooms with 5..21 moves over 1000 seeds each: 1, 2 and 3 boxes need about
2.4, 1.8 and 2.1 attempts and 0.6-0.7 ms per level on average, none failed; 3 boxes need no
more attempts than 2. Lengths lean short (median 6, 7 and 8 moves), since a 4x4 room rarely
allows long optimal solutions; the 1-box case mostly rejects levels under 5 moves.
"""

from __future__ import annotations

import math

import numpy as np

from mage.games.sokoban.level import DELTAS, MOVE_NAMES, Cell, Level
from mage.games.sokoban.solver import dead_squares, is_deadlocked, solve

_STEPS = tuple(DELTAS[name] for name in MOVE_NAMES)

# Share of the interior carved into floor, drawn per attempt: open enough rooms for the
# boxes to move, with some inner walls for variety.
MIN_FLOOR_SHARE, MAX_FLOOR_SHARE = 0.6, 1.0
# Chance that a reverse step pulls the box behind the player when there is one. High, so
# boxes travel; below 1 so the player also walks away from boxes and around them.
PULL_PROBABILITY = 0.9


def generate_level(
    seed: int,
    dim: tuple[int, int] = (6, 6),
    num_boxes: int = 2,
    min_moves: int = 5,
    max_moves: int = 21,
    max_attempts: int = 1000,
) -> tuple[Level, int]:
    """A solvable level for ``seed`` and the length of its shortest solution.

    ``dim`` is ``(height, width)`` including the outer wall, so (6, 6) is a 4x4 room.
    Raises ValueError when no attempt meets the settings within ``max_attempts``.
    """
    height, width = dim
    interior = (height - 2) * (width - 2)
    if height < 3 or width < 3 or width > 26:
        raise ValueError(f"dim must be at least (3, 3) and at most 26 wide, got {dim}")
    if num_boxes < 1 or num_boxes + 1 > interior:
        raise ValueError(f"{num_boxes} boxes and the player do not fit in a {dim} level")
    if not 0 <= min_moves <= max_moves:
        raise ValueError(f"need 0 <= min_moves <= max_moves, got {min_moves}..{max_moves}")
    rng = np.random.default_rng(seed)
    for _ in range(max_attempts):
        level = _candidate(rng, height, width, num_boxes, max_moves)
        if level.is_solved or is_deadlocked(level.walls, level.targets, level.boxes, dead_squares(level)):
            continue
        # Capping the depth at max_moves makes rejecting a too-hard level as cheap as
        # accepting one.
        solution = solve(level, max_depth=max_moves)
        if solution is not None and len(solution) >= min_moves:
            return level, len(solution)
    raise ValueError(
        f"could not generate a {height}x{width} Sokoban level with {num_boxes} boxes whose shortest "
        f"solution has {min_moves}..{max_moves} moves in {max_attempts} attempts (seed {seed})"
    )


def _candidate(rng: np.random.Generator, height: int, width: int, num_boxes: int, max_moves: int) -> Level:
    """One reverse-played level (solvable, not yet checked for its difficulty)."""
    floor = _carve_room(rng, height, width, num_boxes)
    cells = sorted(floor)  # sorted: the rng picks by position, so the order must be fixed
    picks = rng.choice(len(cells), size=num_boxes + 1, replace=False)
    targets = frozenset(cells[i] for i in picks[:num_boxes])
    player = cells[picks[-1]]
    # Reverse steps, scaled to the move range wanted: a random walk undoes much of itself,
    # so it takes several times max_moves steps to spread the lengths (measured: mean
    # optimal length 6.3 / 7.6 / 8.3 moves for 1 / 2 / 3 boxes on 6x6, against 5.7 / 6.5 /
    # 6.4 with half as many). The solver decides afterwards whether the result is in range.
    steps = int(rng.integers(2 * max_moves, 8 * max_moves + 1))
    boxes, player = _reverse_play(rng, floor, set(targets), player, steps)
    walls = frozenset((r, c) for r in range(height) for c in range(width)) - floor
    return Level(walls, targets, frozenset(boxes), player, height, width)


def _carve_room(rng: np.random.Generator, height: int, width: int, num_boxes: int) -> frozenset[Cell]:
    """A connected random-walk region of the interior (the border stays wall)."""
    interior = (height - 2) * (width - 2)
    share = rng.uniform(MIN_FLOOR_SHARE, MAX_FLOOR_SHARE)
    # At least two free cells per box plus the player's, or the boxes cannot move at all.
    wanted = min(interior, max(2 * num_boxes + 2, math.ceil(share * interior)))
    cell = (int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1)))
    floor = {cell}
    # Directions are drawn in batches (one rng call each) for speed; a walk stuck longer
    # than the cap (practically never) keeps the region it has, which is still connected.
    for _ in range(50):
        for step in rng.integers(4, size=4 * interior):
            dr, dc = _STEPS[step]
            nxt = (cell[0] + dr, cell[1] + dc)
            if 1 <= nxt[0] <= height - 2 and 1 <= nxt[1] <= width - 2:
                cell = nxt
                floor.add(cell)
                if len(floor) >= wanted:
                    return frozenset(floor)
    return frozenset(floor)


def _reverse_play(
    rng: np.random.Generator, floor: frozenset[Cell], boxes: set[Cell], player: Cell, steps: int
) -> tuple[set[Cell], Cell]:
    """Walk the player backwards ``steps`` times, pulling boxes (undone pushes)."""
    directions = rng.integers(4, size=steps)
    pulls = rng.random(size=steps) < PULL_PROBABILITY
    for step, pull in zip(directions, pulls):
        dr, dc = _STEPS[step]
        ahead = (player[0] + dr, player[1] + dc)
        if ahead not in floor or ahead in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if pull and behind in boxes:  # the box follows the player: a push, reversed
            boxes.remove(behind)
            boxes.add(player)
        player = ahead
    return boxes, player
