"""Kuhn Poker: episodes, replay, rendering, and every opponent on every information state."""

from __future__ import annotations

import itertools

import pytest
from open_spiel.python.algorithms import cfr

from mage.games import InitialState, Outcome, make_game
from mage.games.kuhn_poker import ALL_DEALS
from mage.opponents import make
from mage.protocol import parse_action

J, Q, K = 0, 1, 2
PASS, BET = 0, 1

# What each rule does, written from its description (docs/method.md, The environments), per
# information state (own card, betting so far) -> action. "" and "p" are decisions with no
# bet outstanding; "b" and "pb" face a bet.
SITUATIONS = ["", "p", "b", "pb"]
EXPECTED = {
    # bets or calls only with K
    "conservative": {(c, h): BET if c == K else PASS for c in (J, Q, K) for h in SITUATIONS},
    # bets whenever nobody has bet; facing a bet folds J, calls Q/K
    "aggressive": {(c, h): BET if h in ("", "p") or c != J else PASS for c in (J, Q, K) for h in SITUATIONS},
    # K bets/calls; J passes/folds; Q bets if nobody has bet, folds facing a bet
    "intermediate": {
        (c, h): BET if c == K or (c == Q and h in ("", "p")) else PASS for c in (J, Q, K) for h in SITUATIONS
    },
    "calling_station": {(c, h): PASS if h in ("", "p") else BET for c in (J, Q, K) for h in SITUATIONS},
    "bluffer": {
        (c, h): (BET if c in (J, K) else PASS) if h in ("", "p") else (PASS if c == J else BET)
        for c in (J, Q, K)
        for h in SITUATIONS
    },
}


def state_at(card: int, history: str):
    """An OpenSpiel state where the player to act holds ``card`` after ``history``."""
    game = make_game("kuhn_poker").openspiel_game
    player = len(history) % 2
    other = next(c for c in (J, Q, K) if c != card)
    state = game.new_initial_state()
    for dealt in (card, other) if player == 0 else (other, card):
        state.apply_action(dealt)
    for move in history:
        state.apply_action(BET if move == "b" else PASS)
    assert state.current_player() == player
    return state, player


@pytest.mark.parametrize("rule", sorted(EXPECTED))
def test_rule_opponents_on_every_information_state(rule):
    opponent = make("kuhn_poker", rule)
    assert opponent.deterministic
    for (card, history), action in EXPECTED[rule].items():
        state, player = state_at(card, history)
        probs = opponent.action_probabilities(state, player)
        assert probs == {action: 1.0, 1 - action: 0.0}, (rule, card, history)
        assert opponent.act(state) == action


def test_random_opponent_is_uniform_and_seeded():
    opponent = make("kuhn_poker", "random")
    state, player = state_at(Q, "")
    assert opponent.action_probabilities(state, player) == {PASS: 0.5, BET: 0.5}
    opponent.reset(7)
    first = [opponent.act(state) for _ in range(40)]
    opponent.reset(7)
    assert [opponent.act(state) for _ in range(40)] == first
    assert set(first) == {PASS, BET}


def test_cfr_opponents_follow_openspiel_cfr():
    solver = cfr.CFRSolver(make_game("kuhn_poker").openspiel_game)
    for _ in range(1000):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    greedy, sampled = make("kuhn_poker", "cfr"), make("kuhn_poker", "cfr", play="sample")
    assert greedy.deterministic and not sampled.deterministic
    for card, history in itertools.product((J, Q, K), SITUATIONS):
        state, player = state_at(card, history)
        reference = average.action_probabilities(state, player)
        best = max(reference, key=reference.get)
        assert greedy.action_probabilities(state, player)[best] == 1.0
        assert sampled.action_probabilities(state, player) == pytest.approx(reference)
    # Spot values of the 1000-iteration average policy: a King facing a bet always calls,
    # a Jack facing a bet folds (OpenSpiel's info-state strings "2b" and "0b").
    state, player = state_at(K, "b")
    assert greedy.act(state) == BET
    state, player = state_at(J, "b")
    assert greedy.act(state) == PASS


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"known opponents: \['aggressive', 'bluffer'"):
        make("kuhn_poker", "shark")
    with pytest.raises(ValueError, match=r"known games: \['kuhn_poker', 'rock_paper_scissors', 'sokoban', 'tic_tac_toe'\]"):
        make("no_such_game", "random")  # chess is OpenSpiel's: the adapter plays it
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['depth'\]"):
        make("kuhn_poker", "cfr", depth=3)
    with pytest.raises(ValueError, match="play must be"):
        make("kuhn_poker", "cfr", play="maybe")


def test_initial_states_replay_exactly_and_cover_all_deals():
    game = make_game("kuhn_poker")
    deals = {tuple(game.initial_state(seed).data["cards"]) for seed in range(200)}
    assert deals == set(ALL_DEALS)
    for seed in range(20):
        initial = game.initial_state(seed, agent_seat=seed % 2)
        assert game.initial_state(seed, agent_seat=seed % 2) == initial
        replayed = InitialState.from_json(initial.to_json())
        a = game.new_episode(initial, make("kuhn_poker", "aggressive"))
        b = game.new_episode(replayed, make("kuhn_poker", "aggressive"))
        assert a.state.history() == b.state.history()
        assert a.render_state() == b.render_state()


def test_episode_play_payoffs_and_text():
    game = make_game("kuhn_poker")
    # Agent second with J, opponent (aggressive) has K: the opponent bets first.
    initial = InitialState("kuhn_poker", 0, 1, {"cards": [K, J]})
    episode = game.new_episode(initial, make("kuhn_poker", "aggressive"))
    assert [m.name for m in episode.history] == ["bet"]
    assert episode.legal_actions() == {"fold": PASS, "call": BET}
    assert "Your card: Jack (J)" in episode.render_state()
    assert "Legal actions: fold, call." in episode.render_state()
    assert parse_action("<action>check</action>", episode.action_aliases()).reason == "'check' is not a legal action"
    episode.apply_agent_actions(parse_action("<action>call</action>", episode.action_aliases()).actions)
    assert episode.is_terminal and episode.outcome() == Outcome.LOSS
    assert episode.agent_return() == -10.0  # lost 2 chips x 5
    assert episode.render_result() == "Showdown, the opponent had King (K): you lost 2 chips."

    # Agent first with Q against conservative holding J: bet, conservative folds J.
    episode = game.new_episode(InitialState("kuhn_poker", 0, 0, {"cards": [Q, J]}), make("kuhn_poker", "conservative"))
    episode.apply_agent_actions([BET])
    assert episode.outcome() == Outcome.WIN and episode.agent_return() == 5.0
    assert episode.render_result() == "The opponent folded: you won 1 chip."
    assert episode.render_history() == "1. You: bet\n2. Opponent: fold"
