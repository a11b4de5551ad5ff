"""Tic-Tac-Toe opponents (docs/method.md, The environments).

Training population: OpenSpiel's MCTS bot (uct_c 1.4, 100 simulations, random-rollout
evaluator, solving on), six preferred-pattern players (first empty cell of a priority
list, else uniformly random) and a uniform-random player. Held-out: MCTS with 1000
simulations, a perfect minimax player and priority lists not used in training.

``beginner`` is in no population: it is the player the tiny preset's warm start imitates
(it takes a win or blocks a threat only some of the time, and moves at random otherwise).

MCTS is a real search (OpenSpiel's C++ ``MCTSBot``): the one every OpenSpiel game's
population may use (:class:`mage.opponents.generic.MCTSOpponent`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pyspiel
from open_spiel.python.algorithms import minimax_solver

from mage.games.tic_tac_toe import cell_name
from mage.opponents.base import Opponent
from mage.opponents.generic import MCTSOpponent

CELLS = {cell_name(a): a for a in range(9)}

# Priority lists over OpenSpiel cells (row * 3 + column; 0 = A1 top left, 8 = C3).
PATTERNS: dict[str, tuple[int, ...]] = {
    # the six lists of the training population
    "centre_first": (4,),
    "corners_first": (0, 2, 6, 8),
    "edges_first": (1, 3, 5, 7),
    "main_diagonal": (0, 4, 8),
    "anti_diagonal": (2, 4, 6),
    # corners in reverse reading order starting at the bottom right, then the centre
    "corners_bottom_right_then_centre": (8, 6, 2, 0, 4),
    # unseen lists for generalisation
    "top_row_first": (0, 1, 2),
    "centre_then_edges": (4, 1, 3, 5, 7),
    "reading_order": (0, 1, 2, 3, 4, 5, 6, 7, 8),
}


def _as_cell(value: int | str) -> int:
    if isinstance(value, str):
        if value.upper() not in CELLS:
            raise ValueError(f"unknown cell {value!r}; cells are {sorted(CELLS)}")
        return CELLS[value.upper()]
    if not 0 <= int(value) <= 8:
        raise ValueError(f"cell index must be 0..8, got {value!r}")
    return int(value)


class RandomOpponent(Opponent):
    rule = "random"
    description = "uniform random over empty cells"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        return {a: 1.0 / len(legal) for a in legal}


class PreferredPatternOpponent(Opponent):
    """Takes the first empty cell of its priority list, else a uniformly random cell."""

    rule = "preferred_pattern"

    def __init__(self, game: pyspiel.Game, pattern: str | None = None, priority: Sequence[int | str] | None = None) -> None:
        if (pattern is None) == (priority is None):
            raise ValueError(f"preferred_pattern: give exactly one of pattern= (one of {sorted(PATTERNS)}) or priority=")
        if pattern is not None:
            if pattern not in PATTERNS:
                raise ValueError(f"preferred_pattern: unknown pattern {pattern!r}; known: {sorted(PATTERNS)}")
            cells = PATTERNS[pattern]
            super().__init__(game, pattern=pattern)
        else:
            cells = tuple(_as_cell(c) for c in priority)
            super().__init__(game, priority=[cell_name(c) for c in cells])
        self.priority = cells
        self.deterministic = set(cells) == set(range(9))
        self.description = "first empty cell of [" + ", ".join(cell_name(c) for c in cells) + "]" + (
            "" if self.deterministic else ", else uniformly random"
        )

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        for cell in self.priority:
            if cell in legal:
                return {a: float(a == cell) for a in legal}
        return {a: 1.0 / len(legal) for a in legal}


@cache
def minimax_table() -> dict:
    """OpenSpiel's minimax solution of Tic-Tac-Toe: state string -> action values."""
    return minimax_solver.MinimaxSolver("tic_tac_toe").solve()


class MinimaxOpponent(Opponent):
    """A perfect player: uniformly random among the minimax-optimal moves."""

    rule = "minimax"
    description = "perfect play (OpenSpiel minimax solver), uniform over optimal moves"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        values = minimax_table()[str(state)].action_values
        best = max(values[a] for a in legal)
        optimal = [a for a in legal if values[a] >= best - 1e-9]
        return {a: (1.0 / len(optimal) if a in optimal else 0.0) for a in legal}


LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def completing_cells(board: Sequence[str], mark: str) -> list[int]:
    """Empty cells that would complete a line of ``mark`` (``board``: 9 of 'x', 'o', '.')."""
    cells = set()
    for line in LINES:
        marks = [board[c] for c in line]
        if marks.count(mark) == 2 and marks.count(".") == 1:
            cells.add(line[marks.index(".")])
    return sorted(cells)


def board_cells(state: pyspiel.State) -> list[str]:
    """The nine cells in OpenSpiel's order as 'x', 'o' or '.'."""
    return list("".join(str(state).split("\n")[:3]))


class BeginnerOpponent(Opponent):
    """A beginner: with probability ``p_win`` it takes an immediate win when it has one;
    otherwise, facing a threat, it blocks with probability ``p_block``; every other move is
    uniformly random. It misses wins and blocks often, which leaves room to learn."""

    rule = "beginner"

    def __init__(self, game: pyspiel.Game, p_win: float = 0.5, p_block: float = 0.4) -> None:
        if not (0.0 <= p_win <= 1.0 and 0.0 <= p_block <= 1.0):
            raise ValueError(f"beginner: p_win and p_block must be in [0, 1], got {p_win}, {p_block}")
        super().__init__(game, p_win=p_win, p_block=p_block)
        self.p_win, self.p_block = float(p_win), float(p_block)
        self.description = (f"takes an immediate win with probability {p_win:g}, else blocks a threat with "
                            f"probability {p_block:g}, else plays uniformly at random")

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        player = state.current_player() if player_id is None else player_id
        board = board_cells(state)
        mine, theirs = ("x", "o") if player == 0 else ("o", "x")
        probs = {a: 0.0 for a in legal}
        rest = 1.0
        # Each candidate kind gets its probability only where such cells exist.
        for cells, chance in ((completing_cells(board, mine), self.p_win), (completing_cells(board, theirs), self.p_block)):
            cells = [c for c in cells if c in probs]
            if cells:
                for cell in cells:
                    probs[cell] += rest * chance / len(cells)
                rest *= 1.0 - chance
        for action in legal:
            probs[action] += rest / len(legal)
        return probs


OPPONENTS = {
    "mcts": MCTSOpponent,
    "preferred_pattern": PreferredPatternOpponent,
    "random": RandomOpponent,
    "minimax": MinimaxOpponent,
    "beginner": BeginnerOpponent,
}
