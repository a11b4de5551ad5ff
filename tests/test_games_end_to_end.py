"""Every game through the whole lifecycle: the ``pipeline`` flow from nothing (population,
the tiny preset built with that game's own warm-start player, one training iteration,
evaluation against the training and held-out opponents, the report), at a smoke size."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from flows import pipeline
from mage.config.compose import compose
from mage.settings.entries import population_entries
from tasks import worker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]

#: The real tiny preset's code path, made small: a smaller model, a short warm start and a
#: one-iteration run. Everything game-specific (warm-start player, population) is the default.
SMOKE = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=512", "model.tiny.corpus_meta_episodes=8", "model.tiny.bc_meta_episodes=8",
    "model.tiny.bc_steps=2", "model.tiny.bc_short_steps=2", "model.tiny.check_meta_episodes=1", "model.tiny.check_sampling.max_new_tokens=8",
    "population.ceilings.n_games=20", "train.iterations=1", "train.mini_batch_size=16", "engine.groups=2",
    "engine.group_size=2", "engine.episodes=2", "engine.sampling.max_new_tokens=8", "eval.meta_episodes=2",
    "eval.episodes=2", "eval.sampling.max_new_tokens=8",
]
WARM_START = {"kuhn_poker": "timid", "tic_tac_toe": "beginner", "sokoban": "wanderer", "rock_paper_scissors": "random"}
#: the games whose populations have exact memoryless and adaptive ceilings (docs/method.md, "Three
#: ceilings per episode"): their report has them for every k; the others' have none
ADAPTATION_CEILINGS = {"kuhn_poker", "rock_paper_scissors"}
FIELDS = ("meta_episodes", "first_win_rate", "final_win_rate", "win_rate_gain", "final_mean_return",
          "max_win_probability", "invalid_rate")


#: (game, its overrides, the preset's directory): each game's default, and the named long
#: Sokoban options (their own warm start, which thinks the cells around the player, in its own
#: directory; sokoban_levels trains on a fixed set of levels and holds out new ones)
RUNS = [(game, [f"game={game}"], f"tiny-{game}") for game in sorted(WARM_START)] + [
    ("sokoban", ["+experiment=sokoban_long"], "tiny-sokoban-long"),
    ("sokoban", ["+experiment=sokoban_levels"], "tiny-sokoban-long")]


def recomputed(table: pl.DataFrame) -> dict[str, dict]:
    """From a trajectory table's play rows, by hand: per opponent and pooled (``all``), the
    meta-episodes, the first and final (last played) episode's win rate, the final's draw
    rate and mean return, the invalid share of play calls, and per episode k the
    meta-episodes that played it, their win rate, pass@k (won in one of episodes 1..k, over
    all meta-episodes) and the invalid share of k's play calls."""
    metas: dict[tuple, dict[int, tuple[bool, bool, float]]] = {}
    calls: dict[tuple, list[bool]] = {}
    for row in table.filter(pl.col("phase") == "play").iter_rows(named=True):
        for opponent in (row["opponent"], "all"):
            meta = (opponent, row["run_id"], row["iteration"], row["meta_id"])
            metas.setdefault(meta, {})[row["episode"]] = (row["won"], row["draw"], row["episode_return"])
            calls.setdefault((opponent, row["episode"]), []).append(row["valid"])
    out: dict[str, dict] = {}
    for opponent in {meta[0] for meta in metas}:
        mine = [episodes for meta, episodes in metas.items() if meta[0] == opponent]
        first = [episodes[min(episodes)] for episodes in mine]
        final = [episodes[max(episodes)] for episodes in mine]
        ks = sorted({k for episodes in mine for k in episodes})
        replies = [valid for k in ks for valid in calls[(opponent, k)]]
        out[opponent] = {
            "meta_episodes": len(mine),
            "first_win_rate": sum(won for won, _, _ in first) / len(mine),
            "final_win_rate": sum(won for won, _, _ in final) / len(mine),
            "final_draw_rate": sum(draw for _, draw, _ in final) / len(mine),
            "final_mean_return": sum(ret for _, _, ret in final) / len(mine),
            "invalid_rate": replies.count(False) / len(replies),
            "episodes": {k: {
                "played": sum(k in episodes for episodes in mine),
                "win_rate": sum(episodes[k][0] for episodes in mine if k in episodes) / sum(k in e for e in mine),
                "pass_at_k": sum(any(episodes[j][0] for j in episodes if j <= k) for episodes in mine) / len(mine),
                "invalid_rate": calls[(opponent, k)].count(False) / len(calls[(opponent, k)]),
            } for k in ks},
        }
    return out


def assert_agrees(figures: dict, expected: dict[str, dict], where: tuple) -> None:
    """The report's rows of one split (``opponents`` and ``episodes``) against :func:`recomputed`."""
    rows = {row["opponent"]: row for row in figures["opponents"]}
    assert set(rows) == set(expected), where
    for opponent, mine in expected.items():
        for field in ("meta_episodes", "first_win_rate", "final_win_rate", "final_draw_rate", "final_mean_return",
                      "invalid_rate"):
            assert rows[opponent][field] == pytest.approx(mine[field]), (*where, opponent, field)
        by_k = {row["episode"]: row for row in figures["episodes"] if row["opponent"] == opponent}
        # an episode k that no meta-episode reached (each won earlier) is listed, played by none
        assert set(by_k) >= set(mine["episodes"]), (*where, opponent)
        assert all(by_k[k]["played"] == 0 for k in set(by_k) - set(mine["episodes"])), (*where, opponent)
        for k, figure in mine["episodes"].items():
            for field, value in figure.items():
                assert by_k[k][field] == pytest.approx(value), (*where, opponent, k, field)


@pytest.mark.parametrize(("game", "chosen", "preset_dir"), RUNS, ids=[" ".join(run[1]) for run in RUNS])
def test_the_pipeline_runs_every_game_from_nothing(game, chosen, preset_dir, tmp_path):
    worker.forget()
    overrides = [*chosen, f"paths.artifacts={tmp_path}", f"paths.results={tmp_path}/results", *SMOKE]
    result = pipeline(overrides)
    worker.forget()

    preset = json.loads((tmp_path / "models" / preset_dir / "preset.json").read_text())
    rule = preset["build"]["bc_rules"][0]
    assert (rule if isinstance(rule, str) else rule["rule"]) == WARM_START[game]  # the game's own player
    assert (isinstance(rule, dict) and rule.get("look_around", False)) == (preset_dir == "tiny-sokoban-long")
    report = json.loads((Path(result["report"]) / "report.json").read_text())
    assert report["about"]["game"] == game and report["about"]["checkpoint"].endswith("ckpt-00001")
    entries = population_entries(compose(chosen))
    for split in ("train", "held_out"):
        expected = {e.id for e in entries if e.split == split}
        assert set(preset["warm_start"][split]) == {*expected, "all"}
        rows = {row["opponent"]: row for row in report["splits"][split]["opponents"]}
        assert set(rows) == {*expected, "all"}  # every opponent of the split is evaluated
        for row in rows.values():
            for field in FIELDS:
                assert row[field] is not None, (split, row["opponent"], field)
            assert 0.0 <= row["final_win_rate"] <= 1.0 and 0.0 <= row["invalid_rate"] <= 1.0
            assert 0.0 <= row["max_win_probability"] <= 1.0
            # the ratio to the ceiling is there unless the evaluated states cannot be won at all
            assert (row["final_win_vs_ceiling"] is None) == (row["max_win_probability"] == 0.0)
        for row in report["splits"][split]["episodes"]:
            bounds = [row["memoryless_ceiling"], row["adaptive_ceiling"], row["pass_at_k_ceiling"]]
            assert (None not in bounds) == (game in ADAPTATION_CEILINGS), row
            assert row["pass_at_k_ceiling"] is not None and 0.0 <= row["pass_at_k_ceiling"] <= 1.0
        # the starting policy was evaluated on the same initial states, and compared per opponent
        gains = {row["opponent"]: row for row in report["splits"][split]["gains"]}
        assert set(gains) == set(rows) and all(row["pairs"] == rows[name]["meta_episodes"] for name, row in gains.items())
    metrics = json.loads((Path(result["report"]) / "metrics.json").read_text())
    for split in ("train", "held_out"):  # the headline numbers dvc exp show lists, per split
        for name in ("final_win_rate", "gain_over_start", "invalid_rate"):
            assert isinstance(metrics[f"{split}/{name}"], float), (split, name)
    # every figure of the report, recomputed here from the evaluation tables it was made of
    # (the checkpoint's and the starting policy's), and the training rollouts' from theirs
    evaluations = tmp_path / "eval" / compose(chosen).run.name
    for split in ("train", "held_out"):
        body = report["splits"][split]
        for policy, figures in ((Path(report["about"]["checkpoint"]).name, body), ("start", body["start"])):
            expected = recomputed(pl.read_parquet(evaluations / policy / f"{split}.parquet"))
            assert_agrees(figures, expected, (split, policy))
    rollouts = pl.read_parquet(next((tmp_path / "runs" / compose(chosen).run.name / "rollouts").glob("*.parquet")))
    play = rollouts.filter(pl.col("phase") == "play")
    invalid = sum(not valid for valid in play["valid"]) / play.height
    training = report["training"]
    assert training["iterations"] == 1 and training["window"] == [1, 1]
    assert training["invalid_rate"] == pytest.approx(invalid) and training["invalid_rate_first"] == pytest.approx(invalid)
    assert training["temperature"] == compose(chosen).engine.sampling.temperature
    assert f"invalid replies {invalid:.3g} over iteration 1" in training["sentence"]
    # the training rollouts and evaluation of sokoban_levels play its 32 levels, and its
    # held-out 2-box entry new ones (an entry's game_params reach the engine)
    run = compose(chosen).run.name
    tables = [*(tmp_path / "runs" / run / "rollouts").glob("*.parquet"), *(tmp_path / "eval" / run).glob("*/*.parquet")]
    assert len(tables) == 5, tables  # one iteration's rollouts; the start's and the checkpoint's two splits
    for table in tables:
        for row in pl.read_parquet(table, columns=["opponent", "initial_state"]).iter_rows(named=True):
            index = json.loads(row["initial_state"])["data"].get("level_index")
            if "+experiment=sokoban_levels" in chosen and row["opponent"] == "boxes_2":
                assert index is not None and 0 <= index < 32, (table, row)
            else:
                assert index is None, (table, row)
