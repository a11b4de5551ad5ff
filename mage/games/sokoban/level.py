"""An immutable Sokoban level (or position) with its rules of movement and text rendering.

A :class:`Level` is the whole position: the static room (walls, targets, size) and the
moving parts (boxes, player). Moving returns a new level, so a position can be stored,
compared and replayed without copying worries. Cells are ``(row, col)`` with ``(0, 0)``
the top-left corner; anything outside the grid behaves like a wall.

Text uses the standard Sokoban symbols except that floor is ``_`` rather than a space, so
that an empty cell is a visible token for a language model. Boards are drawn with column
letters above and row numbers on the left (``C2`` is column C, row 2).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

Cell = tuple[int, int]

WALL, FLOOR, BOX, TARGET, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "$", ".", "*", "@", "+"

# Move words in action-id order; the episode's action ids index this tuple.
MOVE_NAMES = ("up", "down", "left", "right")
DELTAS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

# What a single move did: walked, pushed a box, or nothing (wall or immovable box ahead).
MOVED, PUSHED, BLOCKED = "moved", "pushed", "blocked"


def _cells(raw: Iterable[Iterable[int]]) -> frozenset[Cell]:
    return frozenset((int(r), int(c)) for r, c in raw)


def _sorted_lists(cells: Iterable[Cell]) -> list[list[int]]:
    return [[r, c] for r, c in sorted(cells)]


@dataclass(frozen=True)
class Level:
    """A Sokoban position. Validated on construction so a bad snapshot fails loudly."""

    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    height: int
    width: int

    def __post_init__(self) -> None:
        if not (1 <= self.width <= len(string.ascii_uppercase)) or self.height < 1:
            raise ValueError(f"bad level size {self.height}x{self.width} (width at most 26 for column letters)")
        if len(self.boxes) != len(self.targets) or not self.boxes:
            raise ValueError(f"need as many boxes as targets, at least one: {len(self.boxes)} vs {len(self.targets)}")
        for name, cells in (("wall", self.walls), ("target", self.targets), ("box", self.boxes), ("player", [self.player])):
            outside = [cell for cell in cells if not self.in_bounds(cell)]
            if outside:
                raise ValueError(f"{name} outside the {self.height}x{self.width} grid: {outside[0]}")
        if self.walls & (self.targets | self.boxes) or self.player in self.walls:
            raise ValueError("walls overlap targets, boxes or the player")
        if self.player in self.boxes:
            raise ValueError("the player stands on a box")

    # -- geometry -----------------------------------------------------------------------
    def in_bounds(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.height and 0 <= cell[1] < self.width

    def is_free_floor(self, cell: Cell) -> bool:
        """Inside the grid, not a wall and not a box: somewhere the player or a box can go."""
        return self.in_bounds(cell) and cell not in self.walls and cell not in self.boxes

    @property
    def is_solved(self) -> bool:
        return self.boxes == self.targets

    @property
    def boxes_on_targets(self) -> int:
        return len(self.boxes & self.targets)

    # -- movement -----------------------------------------------------------------------
    def move(self, direction: str) -> tuple[Level, str]:
        """The position after one move and what it did (MOVED, PUSHED or BLOCKED).

        A move into a wall, or into a box with a wall or another box behind it, does
        nothing: the same level comes back with BLOCKED.
        """
        dr, dc = DELTAS[direction]
        ahead = (self.player[0] + dr, self.player[1] + dc)
        if not self.in_bounds(ahead) or ahead in self.walls:
            return self, BLOCKED
        if ahead not in self.boxes:
            return replace(self, player=ahead), MOVED
        beyond = (ahead[0] + dr, ahead[1] + dc)
        if not self.is_free_floor(beyond):
            return self, BLOCKED
        return replace(self, player=ahead, boxes=(self.boxes - {ahead}) | {beyond}), PUSHED

    # -- serialisation ------------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """A JSON-serialisable dict; cell lists are sorted so equal levels give equal data."""
        return {
            "height": self.height,
            "width": self.width,
            "walls": _sorted_lists(self.walls),
            "targets": _sorted_lists(self.targets),
            "boxes": _sorted_lists(self.boxes),
            "player": [self.player[0], self.player[1]],
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Level:
        return cls(
            walls=_cells(data["walls"]),
            targets=_cells(data["targets"]),
            boxes=_cells(data["boxes"]),
            player=(int(data["player"][0]), int(data["player"][1])),
            height=int(data["height"]),
            width=int(data["width"]),
        )

    @classmethod
    def from_text(cls, text: str) -> Level:
        """Parse a plain symbol grid (one row per line, no coordinates; spaces between
        symbols are ignored, short rows are padded with walls). Handy for hand-made levels."""
        rows = [line.replace(" ", "") for line in text.strip("\n").splitlines() if line.strip()]
        height, width = len(rows), max(len(row) for row in rows)
        walls, targets, boxes, players = set(), set(), set(), []
        for r, row in enumerate(rows):
            for c, symbol in enumerate(row.ljust(width, WALL)):
                cell = (r, c)
                if symbol == WALL:
                    walls.add(cell)
                elif symbol in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add(cell)
                if symbol in (BOX, BOX_ON_TARGET):
                    boxes.add(cell)
                elif symbol in (PLAYER, PLAYER_ON_TARGET):
                    players.append(cell)
                elif symbol not in (WALL, FLOOR, TARGET):
                    raise ValueError(f"unknown Sokoban symbol {symbol!r} at row {r + 1}")
        if len(players) != 1:
            raise ValueError(f"a level needs exactly one player, found {len(players)}")
        return cls(frozenset(walls), frozenset(targets), frozenset(boxes), players[0], height, width)

    # -- rendering ----------------------------------------------------------------------
    def symbol(self, cell: Cell) -> str:
        if cell in self.walls:
            return WALL
        on_target = cell in self.targets
        if cell == self.player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        if cell in self.boxes:
            return BOX_ON_TARGET if on_target else BOX
        return TARGET if on_target else FLOOR

    def around_player(self, radius: int = 1) -> list[str]:
        """The square of side ``2 * radius + 1`` centred on the player, one string of symbols
        per row; cells outside the grid read as wall."""
        row, col = self.player
        return ["".join(self.symbol((r, c)) if self.in_bounds((r, c)) else WALL
                        for c in range(col - radius, col + radius + 1))
                for r in range(row - radius, row + radius + 1)]

    def rows(self) -> list[str]:
        """The bare symbol grid, one string per row (the inverse of :meth:`from_text`)."""
        return ["".join(self.symbol((r, c)) for c in range(self.width)) for r in range(self.height)]

    def render(self) -> str:
        """The board with column letters above and row numbers on the left."""
        pad = len(str(self.height))
        lines = [" " * (pad + 1) + " ".join(string.ascii_uppercase[: self.width])]
        for number, row in enumerate(self.rows(), start=1):
            lines.append(f"{number:>{pad}} " + " ".join(row))
        return "\n".join(lines)


def cell_name(cell: Cell) -> str:
    """``(row, col)`` -> the coordinate as drawn, e.g. ``(1, 2)`` -> ``'C2'``."""
    return f"{string.ascii_uppercase[cell[1]]}{cell[0] + 1}"
