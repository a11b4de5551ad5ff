"""Kuhn Poker on OpenSpiel's ``kuhn_poker``.

OpenSpiel holds the rules and payoffs; this module adds the initial-state snapshot (the
deal), text rendering in words and the agent/opponent turn loop. OpenSpiel's actions are
0 = PASS (check, or fold facing a bet) and 1 = BET (bet, or call facing a bet); cards are
0 = Jack, 1 = Queen, 2 = King. The first two moves of a state's history are the deal:
card of player 0, then card of player 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import pyspiel

from mage.games.base import Game, InitialState, check_param
from mage.games.openspiel_episode import OpenSpielEpisode

PASS, BET = 0, 1
CARD_NAMES = ("Jack (J)", "Queen (Q)", "King (K)")
CARD_LETTERS = "JQK"
ALL_DEALS = tuple((a, b) for a in range(3) for b in range(3) if a != b)

RULES = """\
Game: Kuhn Poker, two players.
- The deck has three cards, ranked Jack (J) < Queen (Q) < King (K). Each player puts an ante \
of 1 chip in the pot and is dealt one private card; the third card stays hidden.
- Player 1 acts first: "check" or "bet" (put 1 more chip in).
- If Player 1 checks, Player 2 may "check" (showdown) or "bet".
- A player facing a bet may "fold" (give up the pot) or "call" (put 1 chip in; showdown).
- At a showdown the higher card wins the whole pot. Cards are shown only at a showdown.
- You win or lose 1 or 2 chips per game; your score is 5 points per chip.
Answer with exactly one action inside <action></action>, for example <action>check</action>."""


@cache
def openspiel_game() -> pyspiel.Game:
    return pyspiel.load_game("kuhn_poker")


def facing_bet(betting: Sequence[int]) -> bool:
    """Whether the player to act faces an unanswered bet, given the betting so far."""
    return BET in betting


def betting_history(state: pyspiel.State) -> list[int]:
    """The betting actions of a Kuhn state (its history without the two deal moves)."""
    return list(state.history()[2:])


def action_word(action: int, facing: bool) -> str:
    """The action's name in words: check/bet, or fold/call when facing a bet."""
    if facing:
        return "call" if action == BET else "fold"
    return "bet" if action == BET else "check"


class KuhnPoker(Game):
    name = "kuhn_poker"
    num_players = 2
    # check, bet, call and fold are whole words: the tokenizer keeps them whole already

    def __init__(self, turn_limit: int = 6, payoff_scale: float = 5.0) -> None:
        # the agent acts at most twice in a hand: fewer turns would cut hands off unfinished
        check_param(turn_limit >= 2, "turn_limit", turn_limit, ">= 2")
        check_param(payoff_scale > 0, "payoff_scale", payoff_scale, "> 0")
        self.turn_limit = turn_limit
        self.payoff_scale = payoff_scale
        self.openspiel_game = openspiel_game()

    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        if agent_seat not in (0, 1):
            raise ValueError(f"agent_seat must be 0 or 1, got {agent_seat!r}")
        deal = ALL_DEALS[int(np.random.default_rng(seed).integers(len(ALL_DEALS)))]
        return InitialState(self.name, int(seed), agent_seat, {"cards": list(deal)})

    def initial_states(self, agent_seat: int) -> list[tuple[InitialState, float]]:
        return [(InitialState(self.name, 0, agent_seat, {"cards": list(deal)}), 1 / len(ALL_DEALS))
                for deal in ALL_DEALS]

    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> KuhnEpisode:
        if opponent is None:
            raise ValueError("Kuhn Poker needs an opponent")
        return KuhnEpisode(self, initial, opponent)

    def rules_text(self) -> str:
        return RULES

    def openspiel_state(self, initial: InitialState) -> pyspiel.State:
        state = self.openspiel_game.new_initial_state()
        for card in initial.data["cards"]:
            state.apply_action(int(card))
        return state

    def render_initial_state(self, initial: InitialState) -> str:
        card = initial.data["cards"][initial.agent_seat]
        order = "you act first" if initial.agent_seat == 0 else "the opponent acts first"
        return f"You are Player {initial.agent_seat + 1} ({order}). Your card: {CARD_NAMES[card]}."


class KuhnEpisode(OpenSpielEpisode):
    def move_name(self, action: int) -> str:
        return action_word(action, facing_bet(betting_history(self.state)))

    # -- queries -----------------------------------------------------------------------
    def legal_actions(self) -> dict[str, int]:
        if self.is_terminal:
            return {}
        facing = facing_bet(betting_history(self.state))
        return {action_word(a, facing): a for a in (PASS, BET)}

    def action_aliases(self) -> dict[str, int]:
        aliases = super().action_aliases()
        if aliases:  # the generic pass and bet are accepted in every situation (docs/method.md, The meta-episode)
            aliases.update({"pass": PASS, "bet": BET})
        return aliases

    def _pot(self) -> tuple[int, int]:
        """Chips put in by (agent, opponent), antes included."""
        chips = [1, 1]
        player = 0
        for action in betting_history(self.state):
            chips[player] += action
            player = 1 - player
        return chips[self.agent], chips[1 - self.agent]

    def render_state(self) -> str:
        card = self.initial.data["cards"][self.agent]
        mine, theirs = self._pot()
        lines = [
            f"Your card: {CARD_NAMES[card]}. You are Player {self.agent + 1}.",
            f"Pot: {mine + theirs} chips (you put in {mine}, the opponent {theirs}).",
            "Betting so far:",
            self.render_history(),
        ]
        if not self.is_terminal:
            lines.append("It is your turn. Legal actions: " + ", ".join(self.legal_actions()) + ".")
        return "\n".join(lines)

    def render_result(self) -> str:
        chips = self.utility()  # OpenSpiel scores Kuhn Poker in chips
        won_lost = f"won {abs(chips):g} chip{'s' if abs(chips) != 1 else ''}"
        if chips < 0:
            won_lost = won_lost.replace("won", "lost")
        last = self.history[-1] if self.history else None
        if last is not None and last.name == "fold":
            who = "You folded" if last.actor == "agent" else "The opponent folded"
            return f"{who}: you {won_lost}."
        theirs = CARD_NAMES[self.initial.data["cards"][1 - self.agent]]
        return f"Showdown, the opponent had {theirs}: you {won_lost}."
