"""Any two-player OpenSpiel game through one adapter (mage/games/openspiel_game.py): the shipped
games' prompts against OpenSpiel's own strings, strict parsing, chance drawn from the seed,
nothing hidden shown, games that do not fit refused by key, and the generic opponents against
probabilities written out by hand or computed by OpenSpiel."""

from __future__ import annotations

import itertools

import numpy as np
import pyspiel
import pytest
from conftest import defaults
from hypothesis import given, settings
from hypothesis import strategies as st
from open_spiel.python import policy as openspiel_policy
from open_spiel.python.algorithms import exploitability

from mage.games import checked_game, make_game
from mage.games.openspiel_episode import Replay
from mage.opponents import make
from mage.protocol import parse_action
from mage.settings import SettingsError, load_settings

#: The shipped adapter games, with OpenSpiel's parameters as params/game/ sets them.
SHIPPED = {
    "leduc_poker": {},
    "liars_dice": {"numdice": 1, "dice_sides": 4},
    "goofspiel": {"num_cards": 3, "imp_info": True, "points_order": "random"},
    "connect_four": {},
}


def game_of(name: str):
    return make_game(name, openspiel=SHIPPED[name])


def openspiel_game_of(name: str) -> pyspiel.Game:
    """OpenSpiel's game loaded here, apart from the adapter (simultaneous moves turned to turns)."""
    game = pyspiel.load_game(name, SHIPPED[name])
    if game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


class FirstLegal:
    """An opponent that plays its first legal move (never reseeded: deterministic)."""

    def act(self, state) -> int:
        return state.legal_actions()[0]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_params_files_load_the_game_they_describe(name):
    cfg = defaults(f"game={name}")
    assert cfg.game.name == name and dict(cfg.game.params["openspiel"]) == SHIPPED[name]
    built = checked_game(cfg.game.name, cfg.game.params, "game.params")
    assert str(built.openspiel_game) == str(openspiel_game_of(name))


@pytest.mark.parametrize(("name", "seat"), list(itertools.product(sorted(SHIPPED), (0, 1))))
def test_the_prompt_shows_openspiels_view_and_moves_by_their_names(name, seat):
    game = game_of(name)
    for seed in range(5):
        initial = game.initial_state(seed, seat)
        episode = game.new_episode(initial, FirstLegal())
        rng = np.random.default_rng(seed)
        while not episode.is_terminal:
            state = episode.state
            assert state.current_player() == seat
            # OpenSpiel's own strings: the view (information state, or the board) and each move's name
            view = state.observation_string(seat) if name == "connect_four" else state.information_state_string(seat)
            names = [state.action_to_string(seat, a) for a in state.legal_actions()]
            text = episode.render_state()
            assert view.rstrip() in text
            assert text.endswith("Legal moves: " + ", ".join(names) + ".")
            assert episode.legal_actions() == dict(zip(names, state.legal_actions(), strict=True))
            for move, action in episode.legal_actions().items():
                assert parse_action(f"<action>{move}</action>", episode.action_aliases()).actions == (action,)
            episode.apply_agent_actions([int(rng.choice(state.legal_actions()))])
        assert episode.agent_return() == game.payoff_scale * episode.state.returns()[seat]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_reply_names_exactly_one_legal_move_or_is_invalid(name):
    game = game_of(name)
    episode = game.new_episode(game.initial_state(3, 0), FirstLegal())
    legal = list(episode.legal_actions())
    aliases = episode.action_aliases()
    assert not parse_action(f"<action>{legal[0]}, {legal[-1]}</action>", aliases).valid
    assert not parse_action(f"{legal[0]}", aliases).valid  # no tag
    assert not parse_action("<action>fly</action>", aliases).valid
    assert parse_action(f"<action>{legal[0].upper()}</action>", aliases).actions == (episode.legal_actions()[legal[0]],)


MOVE_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["Call", "Raise", "Fold", "Liar", "1-1", "2-4", "x3", "o3",
                                                             "[P0]Bid: 1", "[P1]Bid: 4", "Bid: 2", " call ", "5-1"]))


@given(st.sampled_from(sorted(SHIPPED)), st.integers(0, 50), st.text(max_size=8), MOVE_TEXT, st.text(max_size=8))
@settings(max_examples=200, deadline=None)
def test_parsing_never_raises_and_accepts_only_a_legal_name(name, seed, before, inner, after):
    game = game_of(name)
    episode = game.new_episode(game.initial_state(seed, seed % 2), FirstLegal())
    if episode.is_terminal:
        return
    parsed = parse_action(f"{before}<action>{inner}</action>{after}", episode.action_aliases())
    assert parsed.valid == (len(parsed.actions) == 1)
    if parsed.valid:
        assert parsed.actions[0] in episode.state.legal_actions()


@pytest.mark.parametrize("name", ["leduc_poker", "liars_dice", "goofspiel"])
def test_chance_comes_from_the_seed_the_deal_and_in_play(name):
    game = game_of(name)
    for seed in range(20):
        initial = game.initial_state(seed, 0)
        assert game.initial_state(seed, 0) == initial  # the deal replays
        histories = []
        for _ in range(2):  # two episodes of a meta-episode: same moves, so the same chance
            episode = game.new_episode(initial, FirstLegal())
            while not episode.is_terminal:
                episode.apply_agent_actions([episode.state.legal_actions()[0]])
            histories.append(episode.state.history())
        assert histories[0] == histories[1]


def test_the_deal_follows_openspiels_chance_probabilities():
    # Leduc's first card: six cards, each 1/6 (OpenSpiel's chance_outcomes); 6,000 seeds
    game = game_of("leduc_poker")
    first = [game.initial_state(seed, 0).data["chance"][0] for seed in range(6000)]
    counts = np.bincount(first, minlength=6)
    assert [p for _, p in openspiel_game_of("leduc_poker").new_initial_state().chance_outcomes()] == [1 / 6] * 6
    assert np.all(np.abs(counts / 6000 - 1 / 6) < 0.02)  # 4.4 standard deviations
    # Leduc's public card is dealt in play: seeds differ in it
    public = set()
    for seed in range(40):
        episode = game.new_episode(game.initial_state(seed, 0), Replay([1] * 4))  # the opponent calls
        episode.apply_agent_actions([1])  # call: round 1 ends, the public card comes
        public.add(episode.state.history()[2 + 2])
    assert len(public) > 1


def test_initial_states_list_every_deal_with_openspiels_probabilities():
    game = game_of("liars_dice")
    listed = game.initial_states(0)
    assert len(listed) == 16 and sum(p for _, p in listed) == pytest.approx(1.0)
    assert {tuple(i.data["chance"]) for i, _ in listed} == set(itertools.product(range(4), range(4)))
    assert game.initial_states(0)[0][0].data == {"chance": [0, 0]}
    assert not game.chance_in_play and game_of("leduc_poker").chance_in_play and game_of("goofspiel").chance_in_play
    assert not game_of("connect_four").chance_in_play


def test_a_prompt_never_shows_the_opponents_hidden_card_or_bid():
    leduc = game_of("leduc_poker")
    # the agent (seat 0) holds card 0; the opponent card 2 or card 5: the prompts are the same
    texts = set()
    for theirs in (2, 5):
        initial = leduc.initial_state(0, 0)
        initial = type(initial)(leduc.name, 0, 0, {"chance": [0, theirs]})
        texts.add(leduc.new_episode(initial, FirstLegal()).render_state())
    assert len(texts) == 1
    # Goofspiel, the agent second: the opponent's bid this round is hidden until the round ends
    goofspiel = game_of("goofspiel")
    texts = set()
    for bid in range(3):
        episode = goofspiel.new_episode(goofspiel.initial_state(0, 1), Replay([bid]))
        texts.add(episode.render_state())
        assert "Opponent" not in episode.render_history()
    assert len(texts) == 1


def test_connect_four_shows_every_move_and_the_board():
    game = game_of("connect_four")
    episode = game.new_episode(game.initial_state(0, 1), Replay([3, 3]))
    assert episode.render_history() == "1. Opponent: x3"
    episode.apply_agent_actions([4])
    assert episode.render_history() == "1. Opponent: x3\n2. You: o4\n3. Opponent: x3"
    assert episode.state.observation_string(1).rstrip() in episode.render_state()


@pytest.mark.parametrize(("override", "message"), [
    ("game.name=catch", "game.name must be a game this project can play: OpenSpiel's catch does not fit, it has 1 "
                        "players; only two-player games"),
    ("game.name=tiny_bridge_4p", "only two-player games"),
    ("game.name=no_such_game", "game.name must be one of"),
    ("game.params.openspiel.num_cards=x", "game.params.openspiel must be parameters OpenSpiel's goofspiel accepts"),
    ("+game.params.openspiel.players=3", "OpenSpiel's goofspiel does not fit, it has 3 players"),
    ("+game.params.rules=short", "game.params: unknown key(s) ['rules']"),
])
def test_a_game_that_does_not_fit_is_refused_before_any_work_by_key(override, message):
    with pytest.raises(SettingsError) as error:
        load_settings(["game=goofspiel", override])
    assert message in str(error.value)


# -- the generic opponents ------------------------------------------------------------------
def first_decision(name: str) -> pyspiel.State:
    state = game_of(name).openspiel_state(game_of(name).initial_state(1, 0))
    return state


def test_fixed_biased_and_random_by_hand():
    state = first_decision("leduc_poker")  # legal: Call (1), Raise (2)
    assert state.legal_actions() == [1, 2]
    params = {"openspiel": {}}
    assert make("leduc_poker", "fixed", params, moves=["Fold", "Raise"]).action_probabilities(state) == {1: 0.0, 2: 1.0}
    assert make("leduc_poker", "fixed", params, moves=["Fold"]).action_probabilities(state) == {1: 0.5, 2: 0.5}
    assert make("leduc_poker", "biased", params, move="Call", probability=0.8).action_probabilities(state) == \
        {1: 0.8, 2: pytest.approx(0.2)}
    assert make("leduc_poker", "random", params).action_probabilities(state) == {1: 0.5, 2: 0.5}
    with pytest.raises(ValueError, match="unknown move 'Check'"):
        make("leduc_poker", "fixed", params, moves=["Check"])
    with pytest.raises(ValueError, match="probability must be in"):
        make("leduc_poker", "biased", params, move="Call", probability=1.5)
    with pytest.raises(ValueError, match="known opponents"):
        make("leduc_poker", "cfr", params)


def test_the_equilibrium_is_openspiels_cfr_plus_and_near_nash():
    game = openspiel_game_of("liars_dice")
    opponent = make("liars_dice", "equilibrium", {"openspiel": SHIPPED["liars_dice"]}, iterations=50)
    # its table, read into OpenSpiel's Python TabularPolicy, has OpenSpiel's Python NashConv (a
    # second implementation beside the C++ one that the description quotes)
    tabular = openspiel_policy.TabularPolicy(game)
    for state in tabular.states:
        row = tabular.policy_for_key(state.information_state_string())
        for action, p in opponent.action_probabilities(state).items():
            row[action] = p
    nash_conv = exploitability.nash_conv(game, tabular)
    assert nash_conv < 0.05
    assert f"NashConv {nash_conv:.6f}" in opponent.description
    greedy = make("liars_dice", "equilibrium", {"openspiel": SHIPPED["liars_dice"]}, iterations=50, play="greedy")
    assert greedy.deterministic and sorted(greedy.action_probabilities(tabular.states[0]).values())[-1] == 1.0


def test_the_equilibrium_is_refused_where_the_game_is_too_large():
    with pytest.raises(ValueError, match="information states; CFR\\+ is not run"):
        make("connect_four", "equilibrium", {"openspiel": {}})


def test_mcts_plays_legal_moves_and_the_same_seed_the_same_game():
    opponent = make("connect_four", "mcts", {"openspiel": {}}, max_simulations=10)
    game = game_of("connect_four")
    moves = []
    for _ in range(2):
        opponent.reset(5)
        episode = game.new_episode(game.initial_state(0, 1), opponent)
        while not episode.is_terminal:
            episode.apply_agent_actions([episode.state.legal_actions()[-1]])
        moves.append(episode.state.history())
    assert moves[0] == moves[1]
