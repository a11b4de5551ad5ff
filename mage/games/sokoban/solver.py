"""Deadlock detection and an optimal (fewest single moves) Sokoban solver.

The solver is a plain breadth-first search over ``(player cell, box cells)``, where every
step, walk or push, costs one move. That is the same unit the agent is charged in (each
word of its ``<action>`` is one move), so the solution length is directly comparable with
the agent's move budget. BFS is exact and, on the small rooms the generator makes
(6x6 with up to 3 boxes: a few thousand states), takes milliseconds. It would not scale to
big classic levels, which this project does not use.

Two standard, *sound* prunings keep the search small: a state they flag can never be
solved, so cutting it cannot lose the shortest solution.

* Simple deadlock ("dead square"): a box off-target on a cell from which no sequence of
  pushes, ignoring the other boxes, reaches any target (corners, most wall edges).
* Freeze deadlock: a 2x2 block made only of walls and boxes, with a box off-target in it.
  No box in such a block can ever move: each direction either pushes it into the block or
  needs the player to stand inside it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set

from mage.games.sokoban.level import DELTAS, MOVE_NAMES, Cell, Level

_STEPS = tuple(DELTAS[name] for name in MOVE_NAMES)


def _add(cell: Cell, delta: Cell, times: int = 1) -> Cell:
    return cell[0] + times * delta[0], cell[1] + times * delta[1]


def dead_squares(level: Level) -> frozenset[Cell]:
    """Floor cells off-target from which a lone box can never be pushed onto a target.

    Computed backwards: a box can be *pulled* from a target one cell in direction ``d``
    when both that cell and the one after it (where the puller steps to) are floor. Every
    floor cell reached this way is live; the rest are dead. Other boxes are ignored, which
    keeps the test sound (it only flags truly hopeless cells).
    """
    floor = {
        (r, c) for r in range(level.height) for c in range(level.width) if (r, c) not in level.walls
    }
    live = set(level.targets)
    queue = deque(level.targets)
    while queue:
        box = queue.popleft()
        for delta in _STEPS:
            pulled_to, puller_to = _add(box, delta), _add(box, delta, 2)
            if pulled_to in floor and puller_to in floor and pulled_to not in live:
                live.add(pulled_to)
                queue.append(pulled_to)
    return frozenset(floor - live)


def _frozen_blocks(cell: Cell) -> list[tuple[Cell, Cell, Cell, Cell]]:
    """The four 2x2 blocks that contain ``cell``."""
    r, c = cell
    return [((r0, c0), (r0, c0 + 1), (r0 + 1, c0), (r0 + 1, c0 + 1)) for r0 in (r - 1, r) for c0 in (c - 1, c)]


def is_deadlocked(walls: Set[Cell], targets: Set[Cell], boxes: Set[Cell], dead: Set[Cell]) -> bool:
    """Whether the position is provably unsolvable by the dead-square or 2x2 freeze test.

    ``dead`` is :func:`dead_squares` of the level (computed once per level, it does not
    depend on where the boxes are).
    """
    loose = [box for box in boxes if box not in targets]
    if any(box in dead for box in loose):
        return True
    for box in loose:
        for block in _frozen_blocks(box):
            if all(cell in walls or cell in boxes for cell in block):
                return True
    return False


class _Grid:
    """The level's static part in flat indices and bit masks, for a fast search.

    Cell ``(r, c)`` is index ``r * width + c``; a set of cells is an int bit mask. Cells
    outside the grid and walls are ``-1`` in the neighbour table (impassable).
    """

    def __init__(self, level: Level) -> None:
        self.width = level.width
        size = level.height * level.width
        self.wall_mask = self.mask(level.walls)
        self.target_mask = self.mask(level.targets)
        self.dead_mask = self.mask(dead_squares(level))
        self.neighbours: list[tuple[int, ...]] = []
        self.blocks: list[list[tuple[int, ...]]] = []
        for i in range(size):
            cell = divmod(i, self.width)
            self.neighbours.append(tuple(self.index(level, _add(cell, d), passable=True) for d in _STEPS))
            self.blocks.append([tuple(self.index(level, c) for c in block) for block in _frozen_blocks(cell)])

    def mask(self, cells: Set[Cell]) -> int:
        return sum(1 << (r * self.width + c) for r, c in cells)

    def index(self, level: Level, cell: Cell, passable: bool = False) -> int:
        """Flat index of ``cell``; -1 if outside the grid (or, with ``passable``, a wall)."""
        if not level.in_bounds(cell) or (passable and cell in level.walls):
            return -1
        return cell[0] * self.width + cell[1]

    def frozen(self, cell: int, boxes: int) -> bool:
        """Freeze test for the 2x2 blocks around a box just pushed onto ``cell``."""
        solid = self.wall_mask | boxes
        loose = boxes & ~self.target_mask
        for block in self.blocks[cell]:
            if all(i < 0 or solid >> i & 1 for i in block) and any(i >= 0 and loose >> i & 1 for i in block):
                return True
        return False


def solve(level: Level, max_depth: int | None = None) -> list[str] | None:
    """A shortest solution in single moves ('up', 'down', 'left', 'right'), pushes included.

    Returns ``[]`` for a solved level, and None when the level is unsolvable or every
    solution is longer than ``max_depth`` moves.
    """
    if level.is_solved:
        return []
    if is_deadlocked(level.walls, level.targets, level.boxes, dead_squares(level)):
        return None
    grid = _Grid(level)
    start = (level.player[0] * grid.width + level.player[1], grid.mask(level.boxes))
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = [start]
    depth = 0
    while frontier and (max_depth is None or depth < max_depth):
        depth += 1
        layer = []
        for state in frontier:
            player, boxes = state
            for direction, ahead in enumerate(grid.neighbours[player]):
                if ahead < 0:
                    continue
                if boxes >> ahead & 1:  # a push: the cell beyond must be free and alive
                    beyond = grid.neighbours[ahead][direction]
                    if beyond < 0 or boxes >> beyond & 1 or grid.dead_mask >> beyond & 1:
                        continue
                    moved = boxes ^ (1 << ahead) ^ (1 << beyond)
                    if grid.frozen(beyond, moved):
                        continue
                    child = (ahead, moved)
                else:
                    child = (ahead, boxes)
                if child in parent:
                    continue
                parent[child] = (state, direction)
                if child[1] == grid.target_mask:
                    return _path(parent, child)
                layer.append(child)
        frontier = layer
    return None


def _path(parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None], state: tuple[int, int]) -> list[str]:
    moves: list[str] = []
    step = parent[state]
    while step is not None:
        state, direction = step
        moves.append(MOVE_NAMES[direction])
        step = parent[state]
    return moves[::-1]
