"""Kuhn Poker opponents (docs/method.md, The environments).

A rule-based player is a table: for its card (J, Q, K) and situation ("open": nobody has
bet yet; "facing_bet": an unanswered bet) the probability of BET (bet or call). The
complementary action is PASS (check or fold). Deterministic rules have 0/1 entries.

Training population: conservative, aggressive, intermediate. Held-out: the CFR average
policy played greedily. Further unseen players for generalisation: bluffer, calling
station, uniform random and the CFR policy played stochastically.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pyspiel
from open_spiel.python.algorithms import cfr

from mage.games.kuhn_poker import BET, PASS, betting_history, facing_bet
from mage.opponents.base import Opponent

J, Q, K = 0, 1, 2
OPEN, FACING_BET = "open", "facing_bet"

# P(BET | card, situation) for every rule-based player; keys are (J, Q, K).
RULE_TABLES: dict[str, dict[str, tuple[float, float, float]]] = {
    # bets or calls only with K
    "conservative": {OPEN: (0, 0, 1), FACING_BET: (0, 0, 1)},
    # bets whenever nobody has bet; facing a bet folds J, calls Q/K
    "aggressive": {OPEN: (1, 1, 1), FACING_BET: (0, 1, 1)},
    # K bets/calls; J passes/folds; Q bets if nobody has bet, folds facing a bet
    "intermediate": {OPEN: (0, 1, 1), FACING_BET: (0, 0, 1)},
    # unseen: bluffs with J and value-bets K, checks Q; calls with Q/K, folds J
    "bluffer": {OPEN: (1, 0, 1), FACING_BET: (0, 1, 1)},
    # unseen: never bets, always calls
    "calling_station": {OPEN: (0, 0, 0), FACING_BET: (1, 1, 1)},
    # unseen: uniform random
    "random": {OPEN: (0.5, 0.5, 0.5), FACING_BET: (0.5, 0.5, 0.5)},
    # a timid beginner: checks and folds four times in five, whatever its card (the tiny
    # preset's warm start imitates it: it speaks the protocol, explores, and plays badly)
    "timid": {OPEN: (0.2, 0.2, 0.2), FACING_BET: (0.2, 0.2, 0.2)},
}

DESCRIPTIONS = {
    "conservative": "bets or calls only with K",
    "aggressive": "bets whenever nobody has bet; facing a bet folds J, calls Q/K",
    "intermediate": "K bets/calls; J passes/folds; Q bets if nobody has bet, folds facing a bet",
    "bluffer": "bets J (bluff) and K when nobody has bet, checks Q; facing a bet folds J, calls Q/K",
    "calling_station": "never bets; always calls a bet",
    "random": "uniform random: check/bet or fold/call with probability 1/2 each",
    "timid": "checks or folds with probability 4/5 whatever its card, bets or calls otherwise",
}


def own_card(state: pyspiel.State, player: int) -> int:
    """The card dealt to ``player`` (the first two history moves are the deal)."""
    return int(state.history()[player])


class KuhnRuleOpponent(Opponent):
    """A Kuhn player given by its P(BET | card, situation) table."""

    def __init__(self, game: pyspiel.Game, rule: str) -> None:
        super().__init__(game)
        self.rule = rule
        self.table = RULE_TABLES[rule]
        self.description = DESCRIPTIONS[rule]
        self.deterministic = all(p in (0, 1) for row in self.table.values() for p in row)

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        player = state.current_player() if player_id is None else player_id
        situation = FACING_BET if facing_bet(betting_history(state)) else OPEN
        p_bet = float(self.table[situation][own_card(state, player)])
        return {PASS: 1.0 - p_bet, BET: p_bet}


@cache
def cfr_average_policy(iterations: int) -> Any:
    """OpenSpiel CFR's average policy after ``iterations`` (vanilla CFR, deterministic)."""
    solver = cfr.CFRSolver(pyspiel.load_game("kuhn_poker"))
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    return solver.average_policy()


class CFROpponent(Opponent):
    """OpenSpiel's CFR average policy, played greedily (most probable action) or sampled."""

    rule = "cfr"

    def __init__(self, game: pyspiel.Game, iterations: int = 1000, play: str = "greedy") -> None:
        if play not in ("greedy", "sample"):
            raise ValueError(f"cfr: play must be 'greedy' or 'sample', got {play!r}")
        if iterations < 1:
            raise ValueError(f"cfr: iterations must be >= 1, got {iterations}")
        super().__init__(game, iterations=iterations, play=play)
        self.average_policy = cfr_average_policy(int(iterations))
        self.deterministic = play == "greedy"
        self.description = f"OpenSpiel CFR average policy ({iterations} iterations), " + (
            "played greedily (most probable action)" if play == "greedy" else "sampled"
        )

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        player = state.current_player() if player_id is None else player_id
        probs = self.average_policy.action_probabilities(state, player)
        if not self.deterministic:
            return {int(a): float(p) for a, p in probs.items()}
        actions = sorted(probs)
        # Ties (never exact after 1000 iterations) go to the lower action, PASS.
        best = actions[int(np.argmax([probs[a] for a in actions]))]
        return {int(a): float(a == best) for a in actions}


def make_rule(rule: str):
    def factory(game: pyspiel.Game) -> KuhnRuleOpponent:
        return KuhnRuleOpponent(game, rule)

    factory.__doc__ = DESCRIPTIONS[rule]
    return factory


OPPONENTS = {rule: make_rule(rule) for rule in RULE_TABLES} | {"cfr": CFROpponent}
