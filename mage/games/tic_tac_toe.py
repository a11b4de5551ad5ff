"""Tic-Tac-Toe on OpenSpiel's ``tic_tac_toe``.

Cells are named by column letter and row number as drawn on the board (A1 top left, C3
bottom right); OpenSpiel's action for a cell is ``row * 3 + column``. Player 0 plays X and
moves first. An initial state may carry opening moves (none by default), so boards other
than the empty one can be replayed exactly as well.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pyspiel

from mage.games.base import Game, InitialState, Outcome, check_param
from mage.games.openspiel_episode import OpenSpielEpisode

MARKS = ("X", "O")

RULES = """\
Game: Tic-Tac-Toe on a 3x3 board, two players.
- Player 1 plays X and moves first, Player 2 plays O; players alternate placing their mark \
in an empty cell.
- Cells are named by column (A, B, C, left to right) and row (1, 2, 3, top to bottom): \
A1 is the top-left corner, B2 the centre, C3 the bottom-right corner.
- Three of your marks in a row, column or diagonal win. A full board without a line is a draw.
- Your score: +10 for a win, 0 for a draw, -10 for a loss.
Answer with exactly one empty cell inside <action></action>, for example <action>B2</action>."""


@cache
def openspiel_game() -> pyspiel.Game:
    return pyspiel.load_game("tic_tac_toe")


def cell_name(action: int) -> str:
    """OpenSpiel action (row * 3 + column) -> cell name such as 'B2'."""
    row, column = divmod(int(action), 3)
    return f"{'ABC'[column]}{row + 1}"


def render_board(state: pyspiel.State) -> str:
    """The board with column letters and row numbers; '.' marks an empty cell."""
    rows = str(state).split("\n")[:3]
    lines = ["  A B C"]
    for number, row in enumerate(rows, start=1):
        lines.append(f"{number} " + " ".join(c.upper() if c in "xo" else "." for c in row))
    return "\n".join(lines)


class TicTacToe(Game):
    name = "tic_tac_toe"
    num_players = 2
    action_names = tuple(cell_name(a) for a in range(9))

    def __init__(self, turn_limit: int = 8, payoff_scale: float = 10.0, opening_moves: int = 0) -> None:
        # the agent moves at most five times in a game: fewer turns would cut games off unfinished
        check_param(turn_limit >= 5, "turn_limit", turn_limit, ">= 5")
        check_param(payoff_scale > 0, "payoff_scale", payoff_scale, "> 0")
        check_param(0 <= opening_moves <= 7, "opening_moves", opening_moves, "in [0, 7] (the game must still be open)")
        self.turn_limit = turn_limit
        self.payoff_scale = payoff_scale
        self.opening_moves = opening_moves
        self.openspiel_game = openspiel_game()

    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        if agent_seat not in (0, 1):
            raise ValueError(f"agent_seat must be 0 or 1, got {agent_seat!r}")
        rng = np.random.default_rng(seed)
        state = self.openspiel_game.new_initial_state()
        opening: list[int] = []
        # Random opening moves (off by default) must leave a game that is still open.
        while len(opening) < self.opening_moves:
            action = int(rng.choice(state.legal_actions()))
            child = state.child(action)
            if child.is_terminal():
                continue
            state, opening = child, opening + [action]
        return InitialState(self.name, int(seed), agent_seat, {"opening": opening})

    def initial_states(self, agent_seat: int) -> list[tuple[InitialState, float]] | None:
        # random openings: too many boards to list (and they are never the default)
        return [(self.initial_state(0, agent_seat), 1.0)] if self.opening_moves == 0 else None

    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> TicTacToeEpisode:
        if opponent is None:
            raise ValueError("Tic-Tac-Toe needs an opponent")
        return TicTacToeEpisode(self, initial, opponent)

    def rules_text(self) -> str:
        return RULES

    def openspiel_state(self, initial: InitialState) -> pyspiel.State:
        state = self.openspiel_game.new_initial_state()
        for action in initial.data.get("opening", []):
            state.apply_action(int(action))
        return state

    def render_initial_state(self, initial: InitialState) -> str:
        state = self.openspiel_state(initial)
        seat = initial.agent_seat
        order = "you move first" if seat == 0 else "the opponent moves first"
        return f"You are Player {seat + 1} and play {MARKS[seat]} ({order}). Starting board:\n{render_board(state)}"


class TicTacToeEpisode(OpenSpielEpisode):
    def move_name(self, action: int) -> str:
        return f"{MARKS[self.state.current_player()]} at {cell_name(action)}"

    def legal_actions(self) -> dict[str, int]:
        if self.is_terminal:
            return {}
        return {cell_name(a): a for a in self.state.legal_actions()}

    def render_state(self) -> str:
        lines = [f"You play {MARKS[self.agent]}. Board:", render_board(self.state), "Moves so far:", self.render_history()]
        if not self.is_terminal:
            lines.append("It is your turn. Empty cells: " + ", ".join(self.legal_actions()) + ".")
        return "\n".join(lines)

    def render_result(self) -> str:
        result = {Outcome.WIN: "You won.", Outcome.LOSS: "The opponent won.", Outcome.DRAW: "Draw."}[self.outcome()]
        return f"{result} Final board:\n{render_board(self.state)}"
