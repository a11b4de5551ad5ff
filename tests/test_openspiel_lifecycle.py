"""Each game played through the OpenSpiel adapter, through the whole lifecycle on the
``scripted`` backend: the ``pipeline`` flow seeds its population (ceilings, the equilibrium's
CFR+ table), builds the game's own tiny preset at a smoke size (its tokenizer, its warm start
and the warm start's check: what ``bash scripts/run.sh -S game=<game>`` builds), trains it for
one iteration on the scripted player's rollouts, evaluates the checkpoint and the starting
policy on the training and held-out opponents, and reports. The report's figures are
recomputed here from the tables."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from test_games_end_to_end import SMOKE as PRESET_SMOKE
from test_games_end_to_end import assert_agrees, recomputed

from flows import pipeline
from mage.config.compose import compose
from mage.settings.entries import population_entries
from tasks import worker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]

GAMES = ("connect_four", "goofspiel", "leduc_poker", "liars_dice")

#: the tiny preset's build made small (test_games_end_to_end.py's), on the scripted backend
SMOKE = [*PRESET_SMOKE, "engine.backend=scripted"]


@pytest.mark.parametrize("game", GAMES)
def test_the_pipeline_runs_an_openspiel_game_on_the_scripted_backend(game, tmp_path):
    worker.forget()
    chosen = [f"game={game}"]
    # the equilibrium's CFR+ at 10 iterations, not 200: the same code, a smaller table to wait for
    cheaper = [] if game == "connect_four" else ["population.held_out.equilibrium.params.iterations=10"]
    overrides = [*chosen, *cheaper, f"paths.artifacts={tmp_path}",
                 f"paths.results={tmp_path}/results", *SMOKE]
    result = pipeline(overrides)
    worker.forget()

    preset = json.loads((tmp_path / "models" / f"tiny-{game}" / "preset.json").read_text())
    assert preset["build"]["bc_rules"] == ["random"]  # the game's own warm start, built
    manifest = json.loads((tmp_path / "population" / f"{game}.json").read_text())
    entries = population_entries(compose(overrides))
    assert {o["id"] for o in manifest["opponents"]} == {e.id for e in entries}
    assert manifest["game_params"]["openspiel"] == dict(compose(chosen).game.params["openspiel"])
    for record in manifest["opponents"]:
        seat_ceiling = record["ceilings"]["seat_0"]["max_win_probability"]
        # exact where the tree can be searched and the opponent is explicit; estimated (with an interval) otherwise
        assert seat_ceiling["method"] == ("monte_carlo" if game == "connect_four" or not record["explicit_policy"]
                                          else "exact"), record["id"]
        assert 0.0 <= seat_ceiling["value"] <= 1.0
        if record["opponent"] == "equilibrium":
            assert "CFR+ average policy after 10 iterations (NashConv" in record["description"]

    report = json.loads((Path(result["report"]) / "report.json").read_text())
    assert report["about"]["game"] == game and report["about"]["checkpoint"].endswith("ckpt-00001")
    evaluations = tmp_path / "eval" / compose(overrides).run.name
    for split in ("train", "held_out"):
        rows = {row["opponent"]: row for row in report["splits"][split]["opponents"]}
        assert set(rows) == {*(e.id for e in entries if e.split == split), "all"}
        body = report["splits"][split]
        for policy, figures in ((Path(report["about"]["checkpoint"]).name, body), ("start", body["start"])):
            assert_agrees(figures, recomputed(pl.read_parquet(evaluations / policy / f"{split}.parquet")), (split, policy))
    # the scripted player answers with OpenSpiel's move names: every play call parses
    rollouts = pl.read_parquet(next((tmp_path / "runs" / compose(overrides).run.name / "rollouts").glob("*.parquet")))
    play = rollouts.filter(pl.col("phase") == "play")
    assert play.height > 0 and play["valid"].all()
