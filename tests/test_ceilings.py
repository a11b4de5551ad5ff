"""Ceilings against values computed independently here, without OpenSpiel's game logic.

Kuhn Poker: the best-response value is the maximum over the agent's 64 pure strategies of
an exhaustive expected payoff; the omniscient win probability maximises over the agent's
plans for each deal. Tic-Tac-Toe: an expectimax over plain board tuples.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import pytest

from mage.games import make_game
from mage.opponents import make
from mage.population.ceilings import opponent_ceilings, proportion_interval

J, Q, K = 0, 1, 2
DEALS = [(a, b) for a in range(3) for b in range(3) if a != b]

# P(BET | card, facing a bet?) for the population's rules, written out again for this test.
KUHN_RULES = {
    "conservative": lambda card, facing: float(card == K),
    "aggressive": lambda card, facing: float(not facing or card != J),
    "intermediate": lambda card, facing: float(card == K or (card == Q and not facing)),
    "random": lambda card, facing: 0.5,
}

# Hand-derived: against conservative, seated first, the agent can win with J vs Q (bet, Q
# folds), Q vs J, K vs J and K vs Q, but never against K (K bets and calls): 4 of 6 deals.
HAND_WIN_FRACTIONS = {("conservative", 0): 4 / 6, ("conservative", 1): 4 / 6}


def showdown(mine: int, theirs: int, stake: int) -> int:
    return stake if mine > theirs else -stake


def kuhn_outcomes(seat: int, mine: int, theirs: int, plan: tuple[int, int], p_bet):
    """(probability, agent payoff) of every ending, for the agent's two-decision plan.

    Seat 0 plan: (first action, response after check-bet). Seat 1 plan: (response to a
    check, response to a bet). 1 = bet/call, 0 = check/fold.
    """
    outcomes = []
    if seat == 0:
        first, answer = plan
        if first == 1:  # agent bets; opponent calls or folds
            call = p_bet(theirs, True)
            outcomes += [(call, showdown(mine, theirs, 2)), (1 - call, 1)]
        else:  # agent checks; opponent bets or checks
            bet = p_bet(theirs, False)
            outcomes.append((1 - bet, showdown(mine, theirs, 1)))
            outcomes.append((bet, showdown(mine, theirs, 2) if answer == 1 else -1))
    else:
        after_check, after_bet = plan
        bet = p_bet(theirs, False)  # the opponent acts first
        if after_bet == 1:
            outcomes.append((bet, showdown(mine, theirs, 2)))
        else:
            outcomes.append((bet, -1))
        if after_check == 1:  # agent bets after a check: opponent calls or folds
            call = p_bet(theirs, True)
            outcomes += [((1 - bet) * call, showdown(mine, theirs, 2)), ((1 - bet) * (1 - call), 1)]
        else:
            outcomes.append((1 - bet, showdown(mine, theirs, 1)))
    return outcomes


PLANS = list(itertools.product((0, 1), repeat=2))


def kuhn_best_response(rule: str, seat: int) -> float:
    p_bet = KUHN_RULES[rule]
    best = float("-inf")
    for strategy in itertools.product(PLANS, repeat=3):  # one plan per own card: 64 strategies
        value = 0.0
        for deal in DEALS:
            mine, theirs = deal[seat], deal[1 - seat]
            value += sum(p * v for p, v in kuhn_outcomes(seat, mine, theirs, strategy[mine], p_bet)) / 6
        best = max(best, value)
    return best


def kuhn_omniscient_win(rule: str, seat: int) -> float:
    p_bet = KUHN_RULES[rule]
    total = 0.0
    for deal in DEALS:
        mine, theirs = deal[seat], deal[1 - seat]
        total += max(sum(p for p, v in kuhn_outcomes(seat, mine, theirs, plan, p_bet) if v > 0) for plan in PLANS)
    return total / 6


@pytest.mark.parametrize("rule", sorted(KUHN_RULES))
@pytest.mark.parametrize("seat", [0, 1])
def test_kuhn_ceilings_match_exhaustive_search(rule, seat):
    game = make_game("kuhn_poker").openspiel_game
    figures = opponent_ceilings(game, make("kuhn_poker", rule), seat)
    assert figures["best_response_payoff"].method == "exact"
    assert figures["best_response_payoff"].value == pytest.approx(kuhn_best_response(rule, seat), abs=1e-12)
    assert figures["max_win_probability"].value == pytest.approx(kuhn_omniscient_win(rule, seat), abs=1e-12)
    if (rule, seat) in HAND_WIN_FRACTIONS:
        assert figures["max_win_probability"].value == pytest.approx(HAND_WIN_FRACTIONS[(rule, seat)])


# -- Tic-Tac-Toe: expectimax on plain tuples -------------------------------------------------
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def winner(board: tuple) -> str | None:
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


def centre_first(board: tuple) -> dict[int, float]:
    empty = [i for i, v in enumerate(board) if v == "."]
    return {4: 1.0} if 4 in empty else {i: 1 / len(empty) for i in empty}


def uniform(board: tuple) -> dict[int, float]:
    empty = [i for i, v in enumerate(board) if v == "."]
    return {i: 1 / len(empty) for i in empty}


def ttt_expectimax(policy, seat: int, utility) -> float:
    me = "XO"[seat]

    @lru_cache(maxsize=None)
    def value(board: tuple) -> float:
        won = winner(board)
        empty = [i for i, v in enumerate(board) if v == "."]
        if won or not empty:
            return utility(won, me)
        mover = "X" if board.count("X") == board.count("O") else "O"
        children = {i: board[:i] + (mover,) + board[i + 1 :] for i in empty}
        if mover == me:
            return max(value(child) for child in children.values())
        return sum(p * value(children[i]) for i, p in policy(board).items())

    return value(tuple("." * 9))


def payoff(won, me):
    return 0.0 if won is None else (1.0 if won == me else -1.0)


def win(won, me):
    return float(won == me)


@pytest.mark.parametrize("seat", [0, 1])
@pytest.mark.parametrize("name,params,policy", [("random", {}, uniform), ("preferred_pattern", {"pattern": "centre_first"}, centre_first)])
def test_tic_tac_toe_ceilings_match_expectimax(seat, name, params, policy):
    game = make_game("tic_tac_toe").openspiel_game
    figures = opponent_ceilings(game, make("tic_tac_toe", name, **params), seat)
    assert figures["best_response_payoff"].value == pytest.approx(ttt_expectimax(policy, seat, payoff), abs=1e-12)
    assert figures["max_win_probability"].value == pytest.approx(ttt_expectimax(policy, seat, win), abs=1e-12)


@pytest.mark.parametrize("seat", [0, 1])
def test_tic_tac_toe_best_response_agrees_with_openspiel(seat):
    from open_spiel.python.algorithms.best_response import BestResponsePolicy

    game = make_game("tic_tac_toe").openspiel_game
    opponent = make("tic_tac_toe", "preferred_pattern", pattern="main_diagonal")
    reference = BestResponsePolicy(game, seat, opponent).value(game.new_initial_state())
    assert opponent_ceilings(game, opponent, seat)["best_response_payoff"].value == pytest.approx(reference, abs=1e-12)


def test_perfect_player_cannot_be_beaten():
    game = make_game("tic_tac_toe").openspiel_game
    for seat in (0, 1):
        figures = opponent_ceilings(game, make("tic_tac_toe", "minimax"), seat)
        assert figures["best_response_payoff"].value == 0.0
        assert figures["max_win_probability"].value == 0.0


class HiddenPolicy:
    """The uniform-random player presented as if its policy had to be estimated (like MCTS)."""

    def __new__(cls):
        opponent = make("tic_tac_toe", "random")
        opponent.explicit = False
        opponent.policy_samples = 10**6  # the 'estimate' is exact: smoothing becomes negligible
        return opponent


def test_monte_carlo_ceiling_brackets_the_exact_value():
    game = make_game("tic_tac_toe").openspiel_game
    exact = ttt_expectimax(uniform, 1, payoff)
    exact_win = ttt_expectimax(uniform, 1, win)
    figures = opponent_ceilings(game, HiddenPolicy(), 1, n_games=600, seed=1)
    payoff_ceiling, win_ceiling = figures["best_response_payoff"], figures["max_win_probability"]
    assert payoff_ceiling.method == win_ceiling.method == "monte_carlo"
    assert payoff_ceiling.n_games == 600 and payoff_ceiling.policy is not None
    assert payoff_ceiling.ci95[0] <= exact <= payoff_ceiling.ci95[1]
    assert win_ceiling.ci95[0] <= exact_win <= win_ceiling.ci95[1]


def test_mcts_ceiling_is_labelled_monte_carlo():
    game = make_game("tic_tac_toe").openspiel_game
    opponent = make("tic_tac_toe", "mcts", max_simulations=20, policy_samples=4)
    figures = opponent_ceilings(game, opponent, 0, n_games=100)
    for figure in figures.values():
        assert figure.method == "monte_carlo" and figure.ci95[0] <= figure.value <= figure.ci95[1]
    # A minimax player is among the candidates, so the estimate cannot be a sure loss.
    assert figures["best_response_payoff"].ci95[1] >= 0.0


def test_wilson_interval_by_hand():
    # Wilson 95% interval for 30/100 (z = 1.959964): centre and half-width by hand.
    z, n, p = 1.959963984540054, 100, 0.3
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    assert proportion_interval(30, 100) == pytest.approx((centre - half, centre + half), abs=1e-9)
