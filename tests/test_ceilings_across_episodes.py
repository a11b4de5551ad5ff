"""The three ceilings per episode k against values computed independently: by hand, and by
brute force over policies written out here (plain Python, no OpenSpiel game logic).

Rock-paper-scissors: the training population of constant players by hand; the held-out one
(biased and reactive players) by enumerating every memoryless schedule and every adaptive
policy of two episodes. Kuhn Poker: every schedule of the agent's plans per card (the
exhaustive Kuhn outcomes of test_ceilings), and 1 - (1 - p)^k from its per-deal best.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ceilings import DEALS, KUHN_RULES, PLANS, kuhn_outcomes

from mage.games import make_game
from mage.opponents import make
from mage.population.ceilings import KINDS, Unavailable, ceilings_across_episodes, search

R, P, S = 0, 1, 2


def beats(move: int) -> int:
    return (move + 1) % 3


def rps_outcome(mine: int, theirs: int) -> int:
    """+1 a win, 0 a draw, -1 a loss, from the cycle written out again."""
    return 0 if mine == theirs else (1 if mine == beats(theirs) else -1)


# the opponents of rock-paper-scissors, written out again: episode history (the agent's
# earlier moves) -> P(move)
def biased(move: int, p: float):
    return lambda mine: {m: p if m == move else (1 - p) / 2 for m in (R, P, S)}


def reactive(answer: str):
    def policy(mine):
        if not mine:
            return {m: 1 / 3 for m in (R, P, S)}
        move = beats(mine[-1]) if answer == "beat" else mine[-1]
        return {m: float(m == move) for m in (R, P, S)}
    return policy


HELD_OUT = {"mostly_rock": (biased(R, 0.7), {"opponent": "biased", "move": "rock", "probability": 0.7}),
            "mostly_paper": (biased(P, 0.7), {"opponent": "biased", "move": "paper", "probability": 0.7}),
            "mostly_scissors": (biased(S, 0.7), {"opponent": "biased", "move": "scissors", "probability": 0.7}),
            "beats_your_last": (reactive("beat"), {"opponent": "reactive", "answer": "beat"}),
            "copies_your_last": (reactive("copy"), {"opponent": "reactive", "answer": "copy"})}


def rps_population(specs):
    return {name: (make("rock_paper_scissors", spec["opponent"], **{k: v for k, v in spec.items() if k != "opponent"}), 1.0)
            for name, (_, spec) in specs.items()}


def pooled(figures, kind, weights=None):
    names = list(figures[kind])
    weights = weights or {name: 1 / len(names) for name in names}
    return [sum(weights[n] * figures[kind][n]["value"][k] for n in names) for k in range(len(figures[kind][names[0]]["value"]))]


def play(policy, opponent, k: int) -> float:
    """P(win within k) of ``policy`` ((agent's earlier moves, opponent's earlier moves) -> move)
    against ``opponent``, by enumeration."""
    def go(mine, theirs, probability):
        if len(mine) == k:
            return 0.0
        move = policy(tuple(mine), tuple(theirs))
        total = 0.0
        for reply, q in opponent(tuple(mine)).items():
            if q == 0:
                continue
            if rps_outcome(move, reply) > 0:
                total += probability * q
            else:
                total += go([*mine, move], [*theirs, reply], probability * q)
        return total
    return go([], [], 1.0)


@pytest.mark.parametrize("seat", [0, 1])
def test_rock_paper_scissors_training_ceilings_by_hand(seat):
    # Against always-rock/paper/scissors at 1/3 each: a player that ignores what it saw wins
    # episode 1 a third of the time and can at best cover one more opponent per episode
    # (1/3, 2/3, 1); one that reads episode 1 wins episode 2 for sure (1/3, 1, 1); one that
    # knows the opponent wins every time.
    population = {m: (make("rock_paper_scissors", "constant", move=m), 1.0) for m in ("rock", "paper", "scissors")}
    figures = ceilings_across_episodes(make_game("rock_paper_scissors"), population, seat, 3)
    assert pooled(figures, "memoryless") == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert pooled(figures, "adaptive") == pytest.approx([1 / 3, 1.0, 1.0])
    assert pooled(figures, "known_opponent") == pytest.approx([1.0, 1.0, 1.0])
    # the gap the game exists for: at least 0.25 at some k <= 3
    assert max(a - m for a, m in zip(pooled(figures, "adaptive"), pooled(figures, "memoryless"))) >= 0.25


def test_rock_paper_scissors_held_out_ceilings_by_brute_force():
    figures = ceilings_across_episodes(make_game("rock_paper_scissors"), rps_population(HELD_OUT), 0, 2)
    opponents = [policy for policy, _ in HELD_OUT.values()]
    moves = (R, P, S)
    for k in (1, 2):
        # memoryless: a move per episode, fixed in advance
        schedules = [lambda mine, theirs, s=s: s[len(mine)] for s in itertools.product(moves, repeat=k)]
        best = max(np.mean([play(policy, o, k) for o in opponents]) for policy in schedules)
        assert pooled(figures, "memoryless")[k - 1] == pytest.approx(best, abs=1e-12)
        # adaptive: the first move, then a move for each opponent move seen in episode 1
        adaptive = [lambda mine, theirs, first=first, then=then: first if not mine else then[theirs[0]]
                    for first in moves for then in itertools.product(moves, repeat=3)]
        best = max(np.mean([play(policy, o, k) for o in opponents]) for policy in adaptive)
        assert pooled(figures, "adaptive")[k - 1] == pytest.approx(best, abs=1e-12)
    # known opponent: a biased player is beaten by the move that beats its favourite (0.7 an
    # episode); a reactive one is a coin in episode 1 and beaten for sure after it
    for name in ("mostly_rock", "mostly_paper", "mostly_scissors"):
        assert figures["known_opponent"][name]["value"] == pytest.approx([0.7, 1 - 0.3**2])
    for name in ("beats_your_last", "copies_your_last"):
        assert figures["known_opponent"][name]["value"] == pytest.approx([1 / 3, 1.0])


@st.composite
def biased_populations(draw):
    size = draw(st.integers(1, 3))
    return [(draw(st.sampled_from(["rock", "paper", "scissors"])), draw(st.floats(1 / 3, 1.0)),
             draw(st.floats(0.1, 1.0))) for _ in range(size)]


@settings(max_examples=25, deadline=None)
@given(biased_populations(), st.sampled_from([0, 1]))
def test_memoryless_below_adaptive_below_known_opponent(population, seat):
    opponents = {f"{i}": (make("rock_paper_scissors", "biased", move=move, probability=p), share)
                 for i, (move, p, share) in enumerate(population)}
    total = sum(share for _, share in opponents.values())
    weights = {name: share / total for name, (_, share) in opponents.items()}
    figures = ceilings_across_episodes(make_game("rock_paper_scissors"), opponents, seat, 3)
    memoryless, adaptive, known = (pooled(figures, kind, weights) for kind in ("memoryless", "adaptive", "known_opponent"))
    for k in range(3):
        assert memoryless[k] <= adaptive[k] + 1e-12 <= known[k] + 2e-12
        if k:  # pass@k never falls with k
            assert all(curve[k] >= curve[k - 1] - 1e-12 for curve in (memoryless, adaptive, known))


# -- Kuhn Poker ----------------------------------------------------------------------------------
TRAIN_SHARES = {"conservative": 0.3, "aggressive": 0.3, "intermediate": 0.4}


def kuhn_win(seat, mine, theirs, plan, rule) -> float:
    return sum(p for p, v in kuhn_outcomes(seat, mine, theirs, plan, KUHN_RULES[rule]) if v > 0)


def kuhn_memoryless(seat: int, k: int, shares) -> float:
    """Best pass@k over schedules of k plans per own card, against the share-weighted rules."""
    total = 0.0
    for mine in (0, 1, 2):
        worlds = [(rule, theirs, share / 2) for rule, share in shares.items() for theirs in range(3) if theirs != mine]
        total += max(sum(w * (1 - np.prod([1 - kuhn_win(seat, mine, theirs, plan, rule) for plan in schedule]))
                         for rule, theirs, w in worlds)
                     for schedule in itertools.product(PLANS, repeat=k))
    return total / 3


@pytest.mark.parametrize("seat", [0, 1])
def test_kuhn_training_ceilings_by_brute_force(seat):
    game = make_game("kuhn_poker")
    population = {rule: (make("kuhn_poker", rule), share) for rule, share in TRAIN_SHARES.items()}
    figures = ceilings_across_episodes(game, population, seat, 3)
    memoryless = [kuhn_memoryless(seat, k, TRAIN_SHARES) for k in (1, 2, 3)]
    assert pooled(figures, "memoryless", TRAIN_SHARES) == pytest.approx(memoryless, abs=1e-12)
    for rule in TRAIN_SHARES:
        for mine, theirs in DEALS:
            deal = (mine, theirs) if seat == 0 else (theirs, mine)
            best = max(kuhn_win(seat, mine, theirs, plan, rule) for plan in PLANS)
            curve = figures["known_opponent"][rule]["per_initial_state"][f"{deal[0]}, {deal[1]}"]
            assert curve == pytest.approx([1 - (1 - best) ** k for k in (1, 2, 3)], abs=1e-12)
    known = pooled(figures, "known_opponent", TRAIN_SHARES)
    # The population's finding: every opponent folds its weak cards to a bet the same way, so one
    # memoryless plan per card is already as good as knowing the opponent and both cards, and
    # adaptation is worth nothing on Kuhn Poker's training population.
    assert memoryless == pytest.approx(known, abs=1e-12)
    assert pooled(figures, "adaptive", TRAIN_SHARES) == pytest.approx(memoryless, abs=1e-12)


def test_unavailable_where_an_opponent_can_only_be_sampled_or_the_game_is_too_large(monkeypatch):
    game = make_game("tic_tac_toe")
    mcts = {"mcts": (make("tic_tac_toe", "mcts", max_simulations=10), 1.0)}
    with pytest.raises(Unavailable, match="no explicit policy"):
        ceilings_across_episodes(game, mcts, 0, 2)
    with pytest.raises(Unavailable, match="more than 20,000 states"):
        ceilings_across_episodes(game, {"random": (make("tic_tac_toe", "random"), 1.0)}, 0, 2)
    # a search over more meta-episodes than it may take stops too
    monkeypatch.setattr(search, "MAX_WORK", 1000)
    population = {m: (make("rock_paper_scissors", "biased", move=m, probability=0.5), 1.0) for m in ("rock", "paper")}
    with pytest.raises(Unavailable, match="too many"):
        ceilings_across_episodes(make_game("rock_paper_scissors"), population, 0, 3)
    assert KINDS == ("memoryless", "adaptive", "known_opponent")
