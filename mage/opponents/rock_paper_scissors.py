"""Rock-paper-scissors opponents (docs/games.md, "Rock-paper-scissors").

Training population: three players that always play the same move. None of the three can be
beaten more than a third of the time by a player that ignores what earlier episodes showed,
and each is beaten every time by one that reads the first episode.

Held out: biased players (one move more often than the others) and players whose move
depends on the meta-episode's earlier episodes (:attr:`Opponent.remembers`): the move that
beats the agent's last move, or the agent's last move itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyspiel

from mage.games.rock_paper_scissors import MOVES, beats
from mage.opponents.base import Opponent

ACTIONS = {name: action for action, name in enumerate(MOVES)}


def _move(value: str, what: str) -> int:
    if value not in ACTIONS:
        raise ValueError(f"{what} must be one of {list(MOVES)}, got {value!r}")
    return ACTIONS[value]


class ConstantOpponent(Opponent):
    """Always plays ``move``."""

    rule = "constant"
    deterministic = True

    def __init__(self, game: pyspiel.Game, move: str = "rock") -> None:
        super().__init__(game, move=move)
        self.move = _move(move, "constant: move")
        self.description = f"always plays {move}"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        return {a: float(a == self.move) for a in range(len(MOVES))}


class BiasedOpponent(Opponent):
    """Plays ``move`` with probability ``probability``, each other move with half the rest."""

    rule = "biased"

    def __init__(self, game: pyspiel.Game, move: str = "rock", probability: float = 0.6) -> None:
        if not (isinstance(probability, (int, float)) and 1 / 3 <= probability <= 1):
            raise ValueError(f"biased: probability must be in [1/3, 1], got {probability!r}")
        super().__init__(game, move=move, probability=probability)
        self.move, self.probability = _move(move, "biased: move"), float(probability)
        self.deterministic = self.probability == 1
        self.description = f"plays {move} with probability {probability:g}, the other moves with half the rest each"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        rest = (1.0 - self.probability) / 2
        return {a: self.probability if a == self.move else rest for a in range(len(MOVES))}


def last_agent_move(past: Sequence[Sequence[int]], own_seat: int) -> int | None:
    """The agent's move in the last earlier episode that has one (an episode the agent forfeited
    with invalid replies has none), from the OpenSpiel histories ``past``."""
    agent = 1 - own_seat
    for history in reversed(past):
        if len(history) > agent:
            return int(history[agent])
    return None


class ReactiveOpponent(Opponent):
    """Answers the agent's move of the last earlier episode: ``beat`` plays the move that beats
    it, ``copy`` plays it again. With no earlier move (episode 1) it plays uniformly at random."""

    rule = "reactive"
    remembers = True

    def __init__(self, game: pyspiel.Game, answer: str = "beat") -> None:
        if answer not in ("beat", "copy"):
            raise ValueError(f"reactive: answer must be 'beat' or 'copy', got {answer!r}")
        super().__init__(game, answer=answer)
        self.answer = answer
        self.description = ("plays the move that beats your move of the episode before; uniformly at random "
                            "in the first" if answer == "beat" else
                            "plays your move of the episode before; uniformly at random in the first")

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        player = state.current_player() if player_id is None else player_id
        last = last_agent_move(self.past, player)
        if last is None:
            return {a: 1.0 / len(MOVES) for a in range(len(MOVES))}
        move = beats(last) if self.answer == "beat" else last
        return {a: float(a == move) for a in range(len(MOVES))}


OPPONENTS = {"constant": ConstantOpponent, "biased": BiasedOpponent, "reactive": ReactiveOpponent}
