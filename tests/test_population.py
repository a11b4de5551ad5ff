"""Populations: declared in the Hydra tree, validated, seeded into a manifest."""

from __future__ import annotations

import json

import pytest

from mage.config.compose import compose
from mage.games.sokoban import generate_level
from mage.population.manifest import load_manifest, seed_population, write_manifest
from mage.settings import load_settings
from mage.settings.entries import population_entries


def test_training_populations_follow_the_spec():
    kuhn = {e.id: e for e in population_entries(compose(["game=kuhn_poker"]))}
    train = {i: e.share for i, e in kuhn.items() if e.split == "train"}
    assert train == {"conservative": 0.3, "aggressive": 0.3, "intermediate": 0.4}
    assert kuhn["cfr_greedy"].split == "held_out" and dict(kuhn["cfr_greedy"].params) == {"iterations": 1000, "play": "greedy"}

    ttt = population_entries(compose(["game=tic_tac_toe"]))
    shares = {}
    for e in ttt:
        if e.split == "train":
            shares[e.opponent] = shares.get(e.opponent, 0) + e.share
    assert shares == {"mcts": 0.5, "preferred_pattern": 0.375, "random": 0.125}
    assert sum(e.opponent == "preferred_pattern" and e.split == "train" for e in ttt) == 6
    mcts = {e.id: dict(e.params) for e in ttt if e.opponent == "mcts"}
    assert mcts["mcts_100"]["max_simulations"] == 100 and mcts["mcts_1000"]["max_simulations"] == 1000
    assert mcts["mcts_100"]["uct_c"] == 1.4 and mcts["mcts_100"]["solve"] is True

    sokoban = {e.id: e for e in population_entries(compose(["game=sokoban"]))}
    assert sokoban["boxes_2"].split == "train" and sokoban["boxes_1"].split == "held_out"
    assert sokoban["boxes_3"].make_game(compose(["game=sokoban"]).game.params).num_boxes == 3


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["population.train.conservative.share=0.5"], "shares sum to 1.2"),
        (["population.train.aggressive.opponent=shark"], r"population.train.aggressive: unknown opponent 'shark'"),
        (["+population.held_out.bluffer.depth=3"], r"population.held_out.bluffer: unknown field\(s\) \['depth'\]"),
        (["population.train.intermediate.share=-0.4"], "share must be > 0"),
    ],
)
def test_bad_populations_are_rejected_with_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        population_entries(compose(["game=kuhn_poker", *overrides]))


@pytest.mark.parametrize(("game", "seats"), [("kuhn_poker", 2), ("tic_tac_toe", 2), ("sokoban", 1), ("rock_paper_scissors", 2)])
def test_seating_follows_the_game(game, seats):
    settings = load_settings([f"game={game}", "population.seat_split=0.25"])
    assert (settings.population.seat_split, settings.game.num_players) == (0.25, seats)


#: Kuhn cards, and the conservative player's ceilings counted by hand (it bets or calls only
#: with K; chips, antes of 1). Seat 0 (the agent acts first), best response per card: J bets
#: (Q folds +1, K calls -2: -1/2), Q checks and folds to a bet (J checks +1, K bets -1: 0),
#: K wins 1 either way: (-1/2 + 0 + 1) / 3 = 1/6. Seat 1: after a check the opponent holds J
#: or Q (K would have bet), so J bets (Q folds: +1) and folds to a bet (-1), Q wins +1 or folds
#: -1, K wins 1: (0 + 0 + 1) / 3 = 1/3. Seeing both cards, the agent wins every deal but those
#: where the opponent holds K and the agent does not: 4 of 6 in either seat.
J, Q, K = 0, 1, 2
CONSERVATIVE_PAYOFF = {0: 1 / 6, 1: 1 / 3}


def test_kuhn_manifest(tmp_path):
    settings = load_settings(["game=kuhn_poker"])
    manifest = seed_population(settings, progress=False)
    path = write_manifest(manifest, tmp_path / "population" / "kuhn_poker.json")
    assert load_manifest(path) == json.loads(json.dumps(manifest))  # what was seeded, read back whole
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    by_id = {o["id"]: o for o in manifest["opponents"]}
    assert {i: (o["split"], o.get("share")) for i, o in by_id.items() if o["split"] == "train"} == {
        "conservative": ("train", 0.3), "aggressive": ("train", 0.3), "intermediate": ("train", 0.4)}
    conservative = by_id["conservative"]
    assert conservative["deterministic"] and conservative["explicit_policy"]
    scale = settings.game.params["payoff_scale"]
    assert scale == 5.0  # the method's Kuhn return: 5 x chips
    deals = [(a, b) for a in (J, Q, K) for b in (J, Q, K) if a != b]
    for seat, payoff in CONSERVATIVE_PAYOFF.items():
        figures = conservative["ceilings"][f"seat_{seat}"]
        assert figures["best_response_payoff"] == {"value": pytest.approx(payoff), "method": "exact"}
        assert figures["best_response_return"] == {"value": pytest.approx(scale * payoff), "method": "exact"}
        # per deal, keyed by OpenSpiel's history of the deal (player 0's card, player 1's)
        by_deal = {f"{cards[0]}, {cards[1]}": 0.0 if cards[1 - seat] == K else 1.0 for cards in deals}
        assert figures["max_win_probability"] == {"value": pytest.approx(4 / 6), "method": "exact",
                                                  "per_initial_state": by_deal}
    assert conservative["ceilings"]["mean"] == pytest.approx(
        {"best_response_payoff": 1 / 4, "best_response_return": 5 / 4, "max_win_probability": 4 / 6})
    # Seeding is deterministic: equal config, equal bytes.
    again = write_manifest(seed_population(load_settings(["game=kuhn_poker"]), progress=False), tmp_path / "again.json")
    assert again.read_bytes() == path.read_bytes()


def test_rock_paper_scissors_manifest_holds_the_three_ceilings_per_k():
    from mage.population.manifest import adaptation_lines, split_ceilings

    manifest = seed_population(load_settings(["game=rock_paper_scissors"]), progress=False)
    by_id = {o["id"]: o for o in manifest["opponents"]}
    assert {i for i, o in by_id.items() if o["split"] == "train"} == {"always_rock", "always_paper", "always_scissors"}
    rock = by_id["always_rock"]["across_episodes"]
    assert rock["prior"] == "shares" and rock["episodes"] == 3 and by_id["beats_your_last"]["across_episodes"]["prior"] == "equal"
    # the one initial state (nothing is dealt), its key OpenSpiel's empty history
    assert rock["seat_1"]["known_opponent"] == {"value": [1.0, 1.0, 1.0], "per_initial_state": {"": [1.0, 1.0, 1.0]}}
    # by hand: 1/3, 2/3, 1 without using what episode 1 showed; 1/3, 1, 1 using it (docs/games.md)
    train = split_ceilings(manifest, "train")
    assert train["memoryless"] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert train["adaptive"] == pytest.approx([1 / 3, 1.0, 1.0])
    # a known biased player is beaten by what beats its favourite, 0.7 an episode
    assert by_id["mostly_rock"]["across_episodes"]["mean"]["known_opponent"] == pytest.approx([0.7, 0.91, 0.973])
    assert adaptation_lines(manifest)[0] == (
        "train: pass@k for k = 1..3: memoryless 0.333, 0.667, 1.000; adaptive 0.333, 1.000, 1.000; known opponent "
        "1.000, 1.000, 1.000; value of adaptation +0.000, +0.333, +0.000")
    # the single-episode ceiling sees the moves as the rules show them: in seat 2 the opponent's
    # choice is made already, and stays hidden (a player who saw it would always win)
    assert by_id["mostly_rock"]["ceilings"]["seat_1"]["max_win_probability"]["value"] == pytest.approx(0.7)


def test_the_three_ceilings_say_why_they_are_missing():
    from mage.population.manifest import split_ceilings

    sokoban = seed_population(load_settings(["game=sokoban"]), progress=False)
    assert "one-player puzzle" in split_ceilings(sokoban, "train")
    assert split_ceilings({"opponents": [{"split": "train", "share": 1.0}]}, "train").startswith("not in this manifest")
    assert split_ceilings({"opponents": []}, "held_out") is None


def test_tic_tac_toe_manifest_labels_monte_carlo_ceilings():
    cfg = load_settings([
        "game=tic_tac_toe",
        "population.ceilings.n_games=60",
        "population.train.mcts_100.params.max_simulations=20",
        "+population.train.mcts_100.params.policy_samples=4",
        "~population.held_out.mcts_1000",
    ])
    manifest = seed_population(cfg, progress=False)
    by_id = {o["id"]: o for o in manifest["opponents"]}
    mcts = by_id["mcts_100"]["ceilings"]["seat_0"]["max_win_probability"]
    assert mcts["method"] == "monte_carlo" and mcts["n_games"] == 60 and len(mcts["ci95"]) == 2
    assert not by_id["mcts_100"]["explicit_policy"]
    assert by_id["minimax"]["ceilings"]["mean"]["max_win_probability"] == 0.0
    assert by_id["pattern_reading_order"]["deterministic"]
    # the training split has an MCTS player, which can only be sampled; the held-out one (no MCTS
    # here) is refused before any search: an episode of Tic-Tac-Toe has 550,000 states
    assert "mcts_100 has no explicit policy" in by_id["mcts_100"]["across_episodes"]["unavailable"]
    assert "more than 20,000 states" in by_id["minimax"]["across_episodes"]["unavailable"]


def test_sokoban_manifest():
    manifest = seed_population(load_settings(["game=sokoban"]), progress=False)
    assert manifest["seat_split"] == 0.0
    for record in manifest["opponents"]:
        assert set(record["ceilings"]) == {"seat_0", "mean"}
        assert record["ceilings"]["seat_0"]["max_win_probability"] == {"value": 1.0, "method": "by_construction"}


def test_a_sokoban_return_ceiling_counts_the_box_reward():
    # A solution ends with every box on a target: +10, plus 1 for each box that did not start
    # on one, averaged over the levels the ceiling samples (seeds 0..39), counted here from
    # the generator directly.
    manifest = seed_population(load_settings(["game=sokoban", "game.params.box_reward=1.0", "population.ceilings.n_games=40"]),
                               progress=False)
    for record in manifest["opponents"]:
        boxes = record["game_params"]["num_boxes"]
        levels = [generate_level(seed, (6, 6), boxes, 5, 21)[0] for seed in range(40)]
        off_target = [sum(box not in level.targets for box in level.boxes) for level in levels]
        best = record["ceilings"]["seat_0"]["best_response_return"]
        assert best["value"] == pytest.approx(10 + sum(off_target) / 40), record["id"]
        assert best["method"] == "monte_carlo" and best["n_games"] == 40
    # on a fixed set of 3 levels the mean is over those 3, exactly
    fixed = seed_population(load_settings(["game=sokoban", "game.params.box_reward=1.0", "game.params.levels=3"]),
                            progress=False)["opponents"][0]
    levels = [generate_level(seed, (6, 6), fixed["game_params"]["num_boxes"], 5, 21)[0] for seed in range(3)]
    off_target = [sum(box not in level.targets for box in level.boxes) for level in levels]
    assert fixed["ceilings"]["seat_0"]["best_response_return"] == {"value": pytest.approx(10 + sum(off_target) / 3),
                                                                   "method": "exact"}
    plain = seed_population(load_settings(["game=sokoban"]), progress=False)["opponents"][0]["ceilings"]["seat_0"]
    assert plain["best_response_return"] == {"value": 10.0, "method": "by_construction"}
