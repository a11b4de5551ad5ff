"""The meta-episode engine driven by the scripted backend: exact trajectories."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import rollout_config, sampling

from mage.backends.scripted import ScriptedBackend
from mage.config.compose import compose
from mage.config.sections import PopulationEntry
from mage.games.kuhn_poker import BET, PASS
from mage.rollout import (
    RolloutEngine,
    plan_meta_episodes,
    read_trajectories,
    write_trajectories,
)
from mage.rollout.plan import MetaEpisodeSpec
from mage.rollout.prompts import PromptTooLongError
from mage.rollout.schema import SchemaError
from mage.settings.entries import population_entries

KUHN = compose(["game=kuhn_poker"])


def entry(opponent: str, game: str = "kuhn_poker") -> PopulationEntry:
    return PopulationEntry(id=opponent, game=game, opponent=opponent, split="train", share=1.0, params={}, game_params={})


def seed_for_deal(cards: list[int], seat: int = 0) -> int:
    """The first seed whose Kuhn deal is ``cards`` (found through the game itself)."""
    from mage.games import make_game

    game = make_game("kuhn_poker")
    return next(s for s in range(1000) if game.initial_state(s, seat).data["cards"] == cards)


def run(specs, rule, cfg=rollout_config(group_size=1), backend=None, game_params=KUHN.game.params):
    engine = RolloutEngine(backend or ScriptedBackend(rule, seed=0), cfg, game_params)
    return engine.run(specs, sampling(), progress=False), engine


def always(action: int):
    return lambda episode: [action]


J, Q, K = 0, 1, 2


def test_losing_meta_episode_plays_every_episode_with_reflections():
    # Agent (seat 0, J) always passes; aggressive (K) bets; the agent folds: -5 each episode.
    spec = MetaEpisodeSpec(0, 0, entry("aggressive"), seat=0, seed=seed_for_deal([J, K]))
    table, _ = run([spec], always(PASS))
    assert table.height == 3 * 2 + 2  # 3 episodes of (check, fold) + 2 reflections
    assert table["phase"].to_list() == ["play", "play", "reflect", "play", "play", "reflect", "play", "play"]
    assert table["episode"].to_list() == [1, 1, 2, 2, 2, 3, 3, 3]
    assert table["turn"].to_list() == [1, 2, 0, 1, 2, 0, 1, 2]
    assert table["action"].to_list() == ["check", "fold", None, "check", "fold", None, "check", "fold"]
    assert table["episode_return"].to_list() == [-5.0] * 8
    assert table["step_reward"].to_list() == [0.0, -5.0, 0.0, 0.0, -5.0, 0.0, 0.0, -5.0]
    assert table["done"].to_list() == [False, True, False, False, True, False, False, True]
    assert not any(table["won"]) and all(table["valid"])
    # The same deal in every episode.
    deals = {json.loads(s)["data"]["cards"] == [J, K] for s in table["initial_state"]}
    assert deals == {True}
    assert all("Your card: Jack (J)" in o for o in table.filter(pl.col("phase") == "play")["observation"])
    # Opponent moves come between the agent's turns.
    second_call = table.filter((pl.col("phase") == "play") & (pl.col("turn") == 2))["observation"][0]
    assert "1. You: check\n2. Opponent: bet" in second_call


def test_progress_shows_the_calls_while_the_meta_episode_count_stands_still(capsys, monkeypatch):
    # Evaluations run their meta-episodes in lockstep, so the count of ended ones stands still
    # for minutes: the bar (stderr, a log file too) must still move with the calls.
    from mage.rollout import engine as engine_module

    monkeypatch.setattr(engine_module, "PROGRESS_SECONDS", 0.0)
    # Always bet: with K against aggressive's J the agent wins at once (its opponent folds); with
    # J against K it loses each episode at its one call: bet, reflect, bet, reflect, bet.
    specs = [MetaEpisodeSpec(0, 0, entry("aggressive"), seat=0, seed=seed_for_deal([K, J])),
             MetaEpisodeSpec(1, 1, entry("aggressive"), seat=0, seed=seed_for_deal([J, K]))]
    engine = RolloutEngine(ScriptedBackend(always(BET), seed=0), rollout_config(group_size=1), KUHN.game.params)
    table = engine.run(specs, sampling(), progress=True)
    assert table.group_by("meta_id").len().sort("meta_id")["len"].to_list() == [1, 5]
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    shown = {line.rstrip().split(", ")[-1].rstrip("]") for line in lines if " 1/2 " in line}  # tqdm pads with spaces
    # one call each at step 1 (the first meta-episode ends), then one a step for the second
    assert {"calls=3", "calls=4", "calls=5"} <= shown, lines


def test_early_stop_after_a_win_is_configurable():
    # Agent (Q) bets; conservative (J) folds: a win in episode 1.
    spec = MetaEpisodeSpec(0, 0, entry("conservative"), seat=0, seed=seed_for_deal([Q, J]))
    table, _ = run([spec], always(BET))
    assert table.height == 1 and table["won"].to_list() == [True] and table["episode_return"].to_list() == [5.0]
    table, _ = run([spec], always(BET), rollout_config(group_size=1, early_stop=False))
    assert table["phase"].to_list() == ["play", "reflect", "play", "reflect", "play"]
    assert table["won"].all()


@pytest.mark.parametrize(
    "mode,reflections,shows_moves,shows_reflection",
    [
        ("reflection_only", 2, False, True),
        ("history_only", 0, True, False),
        ("history_and_reflection", 2, True, True),
    ],
)
def test_context_modes(mode, reflections, shows_moves, shows_reflection):
    spec = MetaEpisodeSpec(0, 0, entry("aggressive"), seat=0, seed=seed_for_deal([J, K]))
    table, _ = run([spec], always(PASS), rollout_config(group_size=1, context_mode=mode))
    assert (table["phase"] == "reflect").sum() == reflections
    last_prompt = table.filter(pl.col("phase") == "play")["prompt"][-1]
    earlier = last_prompt.split("# Earlier episodes")[1].split("# Episode 3 of 3")[0]
    assert ("## Episode 1\nMoves:" in earlier) == shows_moves
    assert ("Your reflection:" in earlier) == shows_reflection
    assert "Result: You folded: you lost 1 chip. Score: -5." in earlier
    assert last_prompt.startswith("Game: Kuhn Poker")  # rules always first


def test_invalid_replies_use_up_turns_until_the_limit():
    spec = MetaEpisodeSpec(0, 0, entry("conservative"), seat=0, seed=7)
    table, _ = run([spec], "random", backend=ScriptedBackend("random", invalid_rate=1.0, seed=1))
    play = table.filter(pl.col("phase") == "play")
    assert play.height == 3 * 6  # turn limit 6 per episode, every reply invalid
    assert not play["valid"].any() and play["invalid_reason"].null_count() == 0
    assert play["truncated"].all() and set(play["episode_return"]) == {-5.0}  # forfeit: lose the ante
    assert play.group_by("episode").agg(pl.col("turn").max())["turn"].to_list() == [6, 6, 6]


def test_mixed_groups_share_state_and_seat_but_not_the_opponent():
    entries = [e for e in population_entries(KUHN) if e.split == "train"]
    specs = plan_meta_episodes(entries, num_groups=10, group_size=4, seed=3, seat_split=0.5, mixed=True)
    assert len(specs) == 40 and [s.meta_id for s in specs] == list(range(40))
    groups = {}
    for s in specs:
        groups.setdefault(s.group_id, []).append(s)
    assert all(len({(s.seed, s.seat) for s in members}) == 1 for members in groups.values())
    assert sum(len({s.entry.id for s in members}) > 1 for members in groups.values()) >= 5
    # the shares deal the 40 meta-episodes: 12, 12 and 16 (0.3/0.3/0.4), half seated second
    dealt = {e.id: sum(s.entry.id == e.id for s in specs) for e in entries}
    assert dealt == {"conservative": 12, "aggressive": 12, "intermediate": 16}
    assert sum(s.seat for s in specs) == 20
    # the initial states and seats are those of the stationary plan: only the opponents move
    stationary = plan_meta_episodes(entries, num_groups=10, group_size=4, seed=3, seat_split=0.5)
    assert [(s.seed, s.seat) for s in specs] == [(s.seed, s.seat) for s in stationary]


def test_the_training_plan_mixes_groups_when_algo_grouping_says_so():
    from mage.run.steps import plan
    from mage.settings import load_settings

    def opponents_per_group(overrides):
        groups = {}
        for s in plan(load_settings(overrides), 0):
            groups.setdefault(s.group_id, set()).add(s.entry.id)
        return [len(v) for v in groups.values()]

    assert set(opponents_per_group([])) == {1}
    assert max(opponents_per_group(["algo.grouping=mixed"])) > 1


def test_groups_seats_and_batched_calls():
    entries = [e for e in population_entries(KUHN) if e.split == "train"]
    specs = plan_meta_episodes(entries, num_groups=10, group_size=4, seed=3, seat_split=0.5)
    assert len(specs) == 40
    groups = {}
    for s in specs:
        groups.setdefault(s.group_id, set()).add((s.entry.id, s.seed, s.seat))
    assert all(len(v) == 1 for v in groups.values())  # a group shares opponent, seed and seat
    seats = [next(iter(v))[2] for v in groups.values()]
    assert seats.count(1) == 5  # half the groups (so half the meta-episodes) seated second
    per_opponent = {}
    for v in groups.values():
        opponent = next(iter(v))[0]
        per_opponent[opponent] = per_opponent.get(opponent, 0) + 1
    assert per_opponent == {"conservative": 3, "aggressive": 3, "intermediate": 4}  # shares 0.3/0.3/0.4

    batches = []

    class Spy(ScriptedBackend):
        def generate(self, requests, sampling):
            batches.append(len(requests))
            return super().generate(requests, sampling)

    table, engine = run(specs, "random", rollout_config(group_size=4), backend=Spy("random", seed=0))
    assert batches[0] == 40 and sum(batches) == table.height
    assert batches == sorted(batches, reverse=True)  # finished meta-episodes stop asking
    assert engine.last_stats.backend_calls == len(batches)
    # Seated second: the opponent has moved before the agent's first call.
    first_calls = table.filter((pl.col("episode") == 1) & (pl.col("turn") == 1))
    for seat, observation in first_calls.select("seat", "observation").iter_rows():
        assert ("1. Opponent:" in observation) == (seat == 1)
    # Sequential baseline: one request per backend call, the same planned work: every planned
    # meta-episode, with its group, opponent, seat and initial state.
    batches.clear()
    sequential, _ = run(specs, "random", rollout_config(group_size=4, concurrency=1), backend=Spy("random", seed=0))
    assert set(batches) == {1} and len(batches) == sequential.height
    plan = ["meta_id", "group_id", "opponent", "seat", "seed", "initial_state"]
    planned = [(s.meta_id, s.group_id, s.entry.id, s.seat, s.seed) for s in specs]
    for played in (table, sequential):
        per_meta = played.select(plan).unique().sort("meta_id")
        assert [row[:5] for row in per_meta.iter_rows()] == planned
        assert per_meta["initial_state"].n_unique() == 10  # one deal per group
    assert per_meta.equals(table.select(plan).unique().sort("meta_id"))
    # The replies differ (149 rows batched, 166 sequential here): this backend draws every reply from
    # one generator in the order the calls come, a step of every live meta-episode at a time
    # batched, one meta-episode to its end after another sequentially. Sequential is exactly
    # the meta-episodes played one by one with one generator; with a seed per call (the
    # engine's, which vllm uses) both modes play the same rows: see the test below.
    one_by_one = ScriptedBackend("random", seed=0)
    alone = pl.concat([run([spec], "random", rollout_config(group_size=4), backend=one_by_one)[0] for spec in specs])
    assert sequential.equals(alone)


class SeededPerCall(ScriptedBackend):
    """The scripted rule drawing each reply from its request's own seed, as vllm samples."""

    def generate(self, requests, sampling):
        replies = []
        for request in requests:
            self.rng = np.random.default_rng(request.seed)
            replies += super().generate([request], sampling)
        return replies


def test_batched_and_sequential_play_the_same_rows_with_a_seed_per_call():
    """The engine derives each call's seed from the rollout's seed, the meta-episode and its
    call number, never from the batch: with a backend that samples by it, the batched engine
    and the sequential loop give the same table, row for row (a random opponent included)."""
    held_out = [e for e in population_entries(KUHN) if e.split == "held_out"]  # stochastic players among them
    specs = plan_meta_episodes(held_out, num_groups=10, group_size=4, seed=5, seat_split=0.5)
    tables = []
    for concurrency in (None, 1, 3):
        engine = RolloutEngine(SeededPerCall("random"), rollout_config(group_size=4, concurrency=concurrency),
                               KUHN.game.params)
        tables.append(engine.run(specs, sampling(seed=7), progress=False))
    assert tables[0].height > len(specs) and {"random", "cfr_sampled"} <= set(tables[0]["opponent"])
    assert tables[1].equals(tables[0]) and tables[2].equals(tables[0])


def test_tic_tac_toe_and_sokoban_rollouts():
    ttt = compose(["game=tic_tac_toe"])
    spec = MetaEpisodeSpec(0, 0, entry("random", "tic_tac_toe"), seat=1, seed=5)
    table, _ = run([spec], "random", game_params=ttt.game.params)
    first = table.filter(pl.col("phase") == "play")["observation"][0]
    assert "1. Opponent: X at" in first and "Empty cells:" in first
    assert table.filter(pl.col("done"))["episode_return"].is_in([10.0, 0.0, -10.0]).all()

    sokoban = compose(["game=sokoban"])
    spec = MetaEpisodeSpec(0, 0, PopulationEntry("boxes_2", "sokoban", "none", "train", 1.0, {}, {}), seat=0, seed=2)
    table, _ = run([spec], "solver", game_params=sokoban.game.params)
    optimal = json.loads(table["initial_state"][0])["data"]["optimal_moves"]
    # The optimal solver solves episode 1 in ceil(optimal / 3) turns of up to 3 moves.
    assert table.height == -(-optimal // 3) and table["won"].all()
    assert all(len(a.split(", ")) <= 3 for a in table["action"])


def test_sokoban_wanderer_mixes_the_solver_with_random_moves():
    from mage.backends.scripted import make_rule

    sokoban = compose(["game=sokoban"])
    spec = MetaEpisodeSpec(0, 0, PopulationEntry("boxes_2", "sokoban", "none", "train", 1.0, {}, {}), seat=0, seed=2)
    # solver_probability 1 is the solver itself; 0 is a random walk of 3 moves a turn.
    always, _ = run([spec], {"rule": "wanderer", "solver_probability": 1.0}, game_params=sokoban.game.params)
    solver, _ = run([spec], "solver", game_params=sokoban.game.params)
    assert always["action"].to_list() == solver["action"].to_list()
    never, _ = run([spec], {"rule": "wanderer", "solver_probability": 0.0}, rollout_config(group_size=1, early_stop=False),
                   game_params=sokoban.game.params)
    plays = never.filter(pl.col("phase") == "play")
    assert plays["valid"].all() and all(len(a.split(", ")) == 3 for a in plays["action"] if a)
    with pytest.raises(ValueError, match="known: \\['random', 'solver', 'wanderer'\\]"):
        make_rule("sokoban", "timid")
    with pytest.raises(ValueError, match="solver_probability must be in"):
        make_rule("sokoban", {"rule": "wanderer", "solver_probability": 2})
    with pytest.raises(ValueError, match="unknown scripted rule 'wanderer' for kuhn_poker"):
        make_rule("kuhn_poker", "wanderer")


def test_sokoban_box_reward_reaches_episodes_that_hit_the_turn_limit():
    # A random walker rarely solves a 2-box level: most episodes end at the turn limit. Their
    # return is the box reward alone, replayed here on the level with Level.move.
    from mage.games.sokoban.level import Level

    specs = [MetaEpisodeSpec(i, i, PopulationEntry("boxes_2", "sokoban", "none", "train", 1.0, {}, {}), seat=0, seed=seed)
             for i, seed in enumerate(range(20, 32))]
    config = rollout_config(group_size=1, early_stop=False)
    walker = {"rule": "wanderer", "solver_probability": 0.0}
    shaped = compose(["game=sokoban", "game.params.box_reward=1.0"]).game.params
    rewarded, _ = run(specs, walker, config, game_params=shaped)
    plain, _ = run(specs, walker, config, game_params=compose(["game=sokoban"]).game.params)
    plays = rewarded.filter(pl.col("phase") == "play")
    assert plays["action"].to_list() == plain.filter(pl.col("phase") == "play")["action"].to_list()
    ends = plays.filter(pl.col("done") & pl.col("truncated"))
    expected = []
    for (meta, episode), rows in plays.group_by(["meta_id", "episode"], maintain_order=True):
        if not rows["truncated"][0]:
            continue
        start = Level.from_data(json.loads(rows["initial_state"][0])["data"]["level"])
        level = start
        for action in rows["action"]:
            for move in action.split(", "):
                level = level.move(move)[0]
        expected.append(float(level.boxes_on_targets - start.boxes_on_targets))
    assert ends.height == len(expected) >= 20
    assert ends["episode_return"].to_list() == expected
    assert ends["step_reward"].to_list() == expected and any(e != 0 for e in expected)
    assert (plain.filter(pl.col("done") & pl.col("truncated"))["episode_return"] == 0.0).all()


def test_surroundings_are_the_3x3_cells_around_the_player():
    from mage.backends.scripted import surroundings
    from mage.games.sokoban.level import Level

    level = Level.from_text("""
        #####
        #._$#
        #@*_#
        #####
    """)
    assert surroundings(level) == " # . _, # @ *, # # #"
    # a player on a target, and a cell outside the grid reads as wall
    edge = Level.from_text("""
        +$_
        ._$
    """)
    assert surroundings(edge) == " # # #, # + $, # . _"


def test_a_wanderer_that_looks_around_thinks_its_surroundings_then_moves_the_same():
    from mage.backends.scripted import make_rule

    sokoban = compose(["game=sokoban"])
    spec = MetaEpisodeSpec(0, 0, PopulationEntry("boxes_2", "sokoban", "none", "train", 1.0, {}, {}), seat=0, seed=2)
    config = rollout_config(group_size=1, early_stop=False)
    looking, _ = run([spec], {"rule": "wanderer", "solver_probability": 0.5, "look_around": True}, config,
                     game_params=sokoban.game.params)
    plain, _ = run([spec], {"rule": "wanderer", "solver_probability": 0.5}, config, game_params=sokoban.game.params)
    plays = looking.filter(pl.col("phase") == "play")
    # the thought takes no random draws: the same moves as without it
    assert plays["action"].to_list() == plain.filter(pl.col("phase") == "play")["action"].to_list()
    for prompt, response in zip(plays["prompt"], plays["response"]):
        board = prompt.rsplit("Board:\n", 1)[1].splitlines()[1:7]  # the current board's rows, labels first
        cells = [row.split()[1:] for row in board]
        (r, c), = [(r, c) for r, row in enumerate(cells) for c, s in enumerate(row) if s in "@+"]
        patch = ", ".join(" ".join(cells[r + dr][c + dc] for dc in (-1, 0, 1)) for dr in (-1, 0, 1))
        assert response.startswith(f"<think> {patch}</think><action>")
    assert plays["valid"].all()  # the engine parses past the thought
    with pytest.raises(ValueError, match="look_around must be true or false"):
        make_rule("sokoban", {"rule": "wanderer", "look_around": "yes"})


def test_a_sokoban_row_s_anchor_leaves_out_the_move_counter():
    sokoban = compose(["game=sokoban"])
    spec = MetaEpisodeSpec(0, 0, PopulationEntry("boxes_2", "sokoban", "none", "train", 1.0, {}, {}), seat=0, seed=2)
    table, _ = run([spec], {"rule": "wanderer", "solver_probability": 0.0}, game_params=sokoban.game.params)
    plays = table.filter(pl.col("phase") == "play")
    assert plays["prompt"].str.contains("Moves made: ").all()
    assert not plays["observation"].str.contains("Moves made").any()
    # Episode 2 restarts the level: its first call has episode 1's first anchor, though its
    # prompt differs (the earlier episode, the reflection).
    firsts = plays.filter(pl.col("turn") == 1).sort("episode")
    assert firsts["observation"][0] == firsts["observation"][1]


def test_prompt_overflow_rules():
    spec = MetaEpisodeSpec(0, 0, entry("aggressive"), seat=0, seed=seed_for_deal([J, K]))
    # Word counts stand in for tokens with the scripted backend; rules + state take ~230.
    with pytest.raises(PromptTooLongError, match="overflow rule: error"):
        run([spec], always(PASS), rollout_config(group_size=1, max_prompt_tokens=280, prompt_overflow="error"))
    table, _ = run([spec], always(PASS), rollout_config(group_size=1, max_prompt_tokens=280, prompt_overflow="drop_oldest"))
    last = table.filter(pl.col("phase") == "play")["prompt"][-1]
    assert table["dropped_episodes"].max() >= 1
    assert "earlier episode(s) omitted to fit the context window]" in last
    assert last.startswith("Game: Kuhn Poker")  # never cut
    with pytest.raises(PromptTooLongError, match="even with every earlier episode dropped"):
        run([spec], always(PASS), rollout_config(group_size=1, max_prompt_tokens=50, prompt_overflow="drop_oldest"))


def test_table_round_trip_and_schema_check(tmp_path):
    specs = plan_meta_episodes([entry("random")], num_groups=2, group_size=2, seed=0)
    table, _ = run(specs, "random", rollout_config(group_size=2))
    path = write_trajectories(table, tmp_path / "rollout.parquet")
    assert read_trajectories(path).equals(table)
    with pytest.raises(SchemaError, match="seat"):
        write_trajectories(table.with_columns(pl.col("seat").cast(pl.Float64)), tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match="lacks column"):
        read_trajectories(write_parquet(table.drop("valid"), tmp_path / "missing.parquet"))


def write_parquet(table, path):
    table.write_parquet(path)
    return path


def test_evaluation_gives_every_opponent_its_groups_whatever_its_training_share():
    # A training opponent evaluated alone (share 0.3 of the population) still gets all its
    # groups: shares are relative to the entries being planned.
    from mage.evaluation.play import evaluate
    from mage.settings import load_settings

    # 48 meta-episodes for the split 'all' (8 opponents): 6 each, whatever the shares
    settings = load_settings(["eval.meta_episodes=48", "eval.episodes=1"])
    cfg = settings.eval.__class__(**{**settings.eval.__dict__, "split": "all"})
    table = evaluate(settings, ScriptedBackend("random", seed=0), cfg, progress=False)
    metas = table.select("opponent", "meta_id", "seat").unique()
    counts = dict(metas.group_by("opponent").len().iter_rows())
    assert counts == {o: 6 for o in ("conservative", "aggressive", "intermediate", "cfr_greedy", "cfr_sampled",
                                    "bluffer", "calling_station", "random")}
    seats = dict(metas.group_by("seat").len().iter_rows())
    assert seats == {0: 24, 1: 24}  # half of every opponent's groups seated second
    # 50 meta-episodes do not divide by 8: whole groups, at least 50 in all (7 each)
    cfg = cfg.__class__(**{**cfg.__dict__, "meta_episodes": 50})
    table = evaluate(settings, ScriptedBackend("random", seed=0), cfg, progress=False)
    assert set(dict(table.select("opponent", "meta_id").unique().group_by("opponent").len().iter_rows()).values()) == {7}


def test_evaluate_checkpoint_plays_each_split_as_evaluate_does(tiny_model_dir):
    # The library's one-call evaluation (what the evaluate task, the paper's table and the
    # learning benchmark use) against evaluate() called split by split with its own backend.
    import dataclasses

    from mage.evaluation.play import evaluate, evaluate_checkpoint
    from mage.models.policy import rollout_backend
    from mage.settings import load_settings

    # the scripted backend tokenizes with the run's model: a saved one, as a fresh clone has no preset built
    settings = load_settings(["engine.backend=scripted", "eval.meta_episodes=16", "run.name=probe",
                              f"model.path={tiny_model_dir}", "model.build=null"])
    cfg = dataclasses.replace(settings.eval, episodes=2)
    tables = evaluate_checkpoint(settings, None, ("train", "held_out"), cfg)
    assert set(tables) == {"train", "held_out"}
    # one backend, splits in turn: the run's scripted backend (it tokenizes its replies as the model would)
    backend = rollout_backend(settings)
    for split, table in tables.items():
        expected = evaluate(settings, backend, dataclasses.replace(cfg, split=split), run_id="probe", progress=False)
        assert table.equals(expected)
        assert set(table["opponent"]) == {e.id for e in settings.population.entries if e.split == split}
        assert table["episode"].max() == 2
