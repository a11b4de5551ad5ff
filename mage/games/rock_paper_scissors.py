"""Rock-paper-scissors on OpenSpiel's ``matrix_rps``, played turn by turn.

The game where adapting across episodes is necessary and exactly measurable (docs/games.md,
"Rock-paper-scissors"): one episode is one round, so everything an episode reveals is the
opponent's move, and the result line of every finished episode says it. Against an opponent
that always plays the same move, a player who reads the first episode wins the second; one
that does not can only guess.

OpenSpiel's normal-form game is converted to a turn-based one
(``pyspiel.convert_to_turn_based``): player 0 chooses, then player 1 chooses without seeing
it, so the seat changes nothing but who is asked first. Actions are 0 = rock, 1 = paper,
2 = scissors; OpenSpiel scores a win +1, a draw 0 and a loss -1 (scaled by ``payoff_scale``).
Nothing is dealt: every initial state is the same.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pyspiel

from mage.games.base import Episode, Game, InitialState, Outcome, check_param
from mage.games.openspiel_episode import OpenSpielEpisode

ROCK, PAPER, SCISSORS = 0, 1, 2
MOVES = ("rock", "paper", "scissors")


def beats(action: int) -> int:
    """The move that beats ``action`` (paper beats rock, scissors paper, rock scissors)."""
    return (int(action) + 1) % 3


RULES = """\
Game: Rock-Paper-Scissors, two players, one round per episode.
- Both players choose rock, paper or scissors at the same time: neither sees the other's \
choice before choosing.
- Paper beats rock, scissors beats paper, rock beats scissors. The same choice is a draw.
- Your score: +10 for a win, 0 for a draw, -10 for a loss.
Answer with exactly one move inside <action></action>, for example <action>rock</action>."""


@cache
def openspiel_game() -> pyspiel.Game:
    return pyspiel.convert_to_turn_based(pyspiel.load_game("matrix_rps"))


class RockPaperScissors(Game):
    name = "rock_paper_scissors"
    num_players = 2
    action_names = MOVES

    def __init__(self, turn_limit: int = 3, payoff_scale: float = 10.0) -> None:
        check_param(turn_limit >= 1, "turn_limit", turn_limit, ">= 1")
        check_param(payoff_scale > 0, "payoff_scale", payoff_scale, "> 0")
        self.turn_limit = turn_limit
        self.payoff_scale = payoff_scale
        self.openspiel_game = openspiel_game()

    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        if agent_seat not in (0, 1):
            raise ValueError(f"agent_seat must be 0 or 1, got {agent_seat!r}")
        return InitialState(self.name, int(seed), agent_seat, {})

    def initial_states(self, agent_seat: int) -> list[tuple[InitialState, float]]:
        return [(self.initial_state(0, agent_seat), 1.0)]

    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> RockPaperScissorsEpisode:
        if opponent is None:
            raise ValueError("rock-paper-scissors needs an opponent")
        return RockPaperScissorsEpisode(self, initial, opponent)

    def rules_text(self) -> str:
        return RULES

    def openspiel_state(self, initial: InitialState) -> pyspiel.State:
        return self.openspiel_game.new_initial_state()

    def render_initial_state(self, initial: InitialState) -> str:
        return "You and the opponent choose at the same time."

    def reflection_plan(self, episode: Episode) -> str | None:
        theirs = next((m.action for m in episode.history if m.actor == "opponent"), None)
        if theirs is None or not episode.is_terminal:
            return None
        return f"{MOVES[theirs]} loses to {MOVES[beats(theirs)]}, so play {MOVES[beats(theirs)]}"


class RockPaperScissorsEpisode(OpenSpielEpisode):
    def move_name(self, action: int) -> str:
        return MOVES[action]

    def legal_actions(self) -> dict[str, int]:
        if self.is_terminal:
            return {}
        return {MOVES[a]: a for a in self.state.legal_actions()}

    def render_state(self) -> str:
        # the opponent may have chosen already (the agent in seat 1): its move stays hidden
        if self.is_terminal:
            return self.render_result()
        return "Choose your move. Legal actions: " + ", ".join(self.legal_actions()) + "."

    def _move_of(self, actor: str) -> str:
        return next((m.name for m in self.history if m.actor == actor), "nothing")

    def render_result(self) -> str:
        verdict = {Outcome.WIN: "you won", Outcome.LOSS: "you lost", Outcome.DRAW: "a draw"}[self.outcome()]
        return f"You played {self._move_of('agent')}, the opponent played {self._move_of('opponent')}: {verdict}."
