"""Games held out at evaluation (``eval.games``, issue 69 item 5): a checkpoint and its starting
policy played on games the checkpoint did not train on, each against its own population, with a
section per game in the report.

What a held-out game's settings are is checked against ``load_settings([f"game={game}"])`` and
the run's own settings; what the report says about it is checked against the tables it wrote,
played here by the scripted backend (cheap; the flows' byte-for-byte agreement with the library
on a held-out game is in ``tests/test_flows.py``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.config.sections import EvalSection
from mage.settings import SettingsError, held_out_settings, load_settings
from mage.settings.validate import build, held_out_games

RUN = ["eval.episodes=2", "eval.meta_episodes=4", "eval.sampling.temperature=0.3", "seed=7"]


@pytest.fixture(scope="module")
def run_settings():
    return load_settings(RUN)


def test_a_held_out_game_is_its_own_game_and_population_with_the_runs_model_engine_and_evaluation(run_settings):
    held = held_out_settings(run_settings, "leduc_poker")
    own = load_settings(["game=leduc_poker", *RUN])  # the game as its own run composes it
    assert held.game == own.game and held.population == own.population
    assert held.population.ceilings.episodes == 2  # its ${eval.episodes}, resolved against the run's
    assert held.paths.population_manifest == own.paths.population_manifest == "artifacts/population/leduc_poker.json"
    # the run's model (its Kuhn Poker preset, not Leduc's), engine, evaluation, run and other paths
    assert held.model == run_settings.model and held.model.path == "artifacts/models/tiny-kuhn_poker"
    assert (held.engine, held.algo, held.train, held.flow, held.seed, held.run) == \
        (run_settings.engine, run_settings.algo, run_settings.train, run_settings.flow, 7, run_settings.run)
    assert held.eval == dataclasses.replace(run_settings.eval, games=())  # nothing held out from a held-out game
    assert dataclasses.replace(held.paths, population_manifest=run_settings.paths.population_manifest) == \
        run_settings.paths
    # its raw config is the game's too: the tasks' cache keys and the tables' record follow it
    assert held.raw["game"]["name"] == "leduc_poker" and held.raw["model"] == run_settings.raw["model"]


def test_the_games_are_validated_whole_when_the_settings_load():
    loaded = load_settings(["eval.games=[leduc_poker,rock_paper_scissors]"])
    assert loaded.eval.games == ("leduc_poker", "rock_paper_scissors")
    assert load_settings([]).eval.games == ()  # params/eval/default.yaml: none


@pytest.mark.parametrize(("games", "says"), [
    ("[kuhn_poker]", "the run trains on kuhn_poker"),
    ("[leduc_poker,kuhn_poker]", "the run trains on kuhn_poker"),
    ("[chess]", "unknown game, there is no params/game/chess.yaml and no params/population/chess.yaml"),
    ("[leduc_poker,liars_dice,leduc_poker]", "leduc_poker is listed more than once"),
    ("['../game/kuhn_poker']", "is not a game's name"),
    ("['']", "is not a game's name"),
    ("leduc_poker", "must be a valid tuple"),
    ("[[leduc_poker]]", "must be a valid string"),
    ("null", "must be a valid tuple"),
])
def test_a_wrong_list_of_games_is_refused_naming_the_key(games, says):
    with pytest.raises(SettingsError) as error:
        load_settings([f"eval.games={games}"])
    message = str(error.value)
    assert message.startswith("eval.games") and says in message and "\n" not in message, message


def test_a_game_whose_population_does_not_fit_it_is_refused_naming_the_game(tmp_path, monkeypatch):
    # a copy of params/ whose Leduc population plays a move Leduc does not have
    import shutil

    from mage.config.compose import config_dir

    shutil.copytree(config_dir(), tmp_path / "params")
    population = tmp_path / "params" / "population" / "leduc_poker.yaml"
    population.write_text(population.read_text().replace("moves: [Call]}", "moves: [Check]}"))
    monkeypatch.setenv("MAGE_CONFIG_DIR", str(tmp_path / "params"))
    with pytest.raises(SettingsError, match=r"^eval\.games: 'leduc_poker': population\.train\.calling_station"):
        load_settings(["eval.games=[leduc_poker]"])


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12) | st.sampled_from(held_out_games()))
def test_whatever_name_is_asked_for_a_held_out_game_is_settings_or_a_settings_error(run_settings, game):
    try:
        held = held_out_settings(run_settings, game)
    except SettingsError as error:
        assert str(error).startswith(f"eval.games: {game!r}: ")
        assert game == "kuhn_poker" or game not in held_out_games()
    else:
        assert game in held_out_games() and held.game.name != "kuhn_poker" and held.model == run_settings.model


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=6) | st.integers() | st.none(), max_size=4) | st.text(max_size=6) | st.none())
def test_whatever_the_key_holds_the_section_is_built_or_refused_naming_it(run_settings, games):
    section = {**run_settings.raw["eval"], "games": games}
    try:
        built = build(EvalSection, section, "eval")
    except SettingsError as error:
        assert str(error).startswith("eval.games")
    else:
        assert built.games == tuple(games) and len(set(games)) == len(games)


# -- played: the scripted backend's checkpoint and start, on Kuhn Poker and rock-paper-scissors ------------
@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, tmp_path_factory):
    """A checkpoint of the small model (the scripted backend plays it), evaluated with its start on
    the run's held-out Kuhn Poker opponents and on rock-paper-scissors (cheap ceilings), reported."""
    from mage.models import checkpoint as ckpt
    from mage.models.policy import load_policy
    from mage.run import RunLayout, evaluate
    from mage.trainer.policy_trainer import PolicyTrainer

    root = tmp_path_factory.mktemp("held-out")
    args = [f"model.path={tiny_model_dir}", "model.build=null", "engine.backend=scripted", "eval.meta_episodes=6",
            "eval.episodes=2", "eval.sampling.max_new_tokens=8", "engine.sampling.max_new_tokens=8",
            "population.ceilings.n_games=20", f"paths.artifacts={root}", f"paths.results={root}/results",
            "eval.games=[rock_paper_scissors]"]
    run = load_settings(args)
    policy = load_policy(str(tiny_model_dir))
    saved = ckpt.save_checkpoint(RunLayout.of(run).checkpoints, 1, policy, PolicyTrainer(policy, run.train, run.algo)
                                 .optimizer, config_hash="h", parent=None, metrics={})
    written = evaluate(run, checkpoint=saved.path, split="held_out")
    return {"args": args, "root": root, "checkpoint": saved.path, "written": written, "settings": run}


def test_a_held_out_game_is_played_into_its_own_folder_by_the_checkpoint_and_its_start(evaluated):
    run = evaluated["settings"]
    directory = Path(evaluated["written"]["directory"])
    held = held_out_settings(run, "rock_paper_scissors")
    for side in (directory, Path(run.paths.start_evaluation)):
        table = pl.read_parquet(side / "rock_paper_scissors" / "held_out.parquet")
        assert set(table["opponent"]) == set(held.population.held_out)
        assert {json.loads(state)["game"] for state in table["initial_state"]} == {"rock_paper_scissors"}
        assert table.filter(pl.col("phase") == "play")["prompt"].str.contains("rock").all()  # the game's own prompts
        record = json.loads((side / "rock_paper_scissors" / "held_out-metrics.json").read_text())["policy"]
        assert record["checkpoint"] == (str(evaluated["checkpoint"]) if side == directory else None)
    assert (Path(held.paths.population_manifest)).is_file()  # its own manifest, beside the run's


def test_the_report_has_a_section_per_held_out_game_with_its_gains_and_headline_numbers(evaluated):
    from mage.report.tables import held_out_game, split_sections
    from mage.rollout import read_trajectories

    run, written = evaluated["settings"], evaluated["written"]
    directory = Path(written["directory"])
    report = json.loads(Path(written["files"]["report"]).read_text())
    assert report["about"]["held_out_games"] == ["rock_paper_scissors"]
    section = report["games"]["rock_paper_scissors"]
    assert section["about"]["game"] == "rock_paper_scissors"
    manifest = json.loads(Path(held_out_settings(run, "rock_paper_scissors").paths.population_manifest).read_text())
    tables = {"held_out": read_trajectories(directory / "rock_paper_scissors" / "held_out.parquet")}
    start = {"held_out": read_trajectories(Path(run.paths.start_evaluation) / "rock_paper_scissors" / "held_out.parquet")}
    # the same figures as the run's own game gets from these tables (one definition: split_sections)
    expected = json.loads(json.dumps(held_out_game(tables, manifest, 2, True, start)))
    assert section == expected
    assert section["splits"]["held_out"] == json.loads(json.dumps(split_sections(tables, manifest, 2, True, start)))[
        "held_out"]
    pooled = next(r for r in section["splits"]["held_out"]["gains"] if r["opponent"] == "all")
    metrics = json.loads(Path(written["files"]["metrics"]).read_text())
    assert metrics["rock_paper_scissors/held_out/gain_over_start"] == round(pooled["final_win_rate_gain"], 6)
    assert metrics["rock_paper_scissors/held_out/start_final_win_rate"] == round(pooled["final_win_rate_start"], 6)
    assert "held_out/final_win_rate" in metrics  # the run's own game's, as before
    markdown = Path(written["files"]["markdown"]).read_text()
    assert "## Held-out game: rock_paper_scissors" in markdown
    for heading in ("did it learn?", "the evaluated policy", "the starting policy", "per episode k",
                    "success by episode k against the three ceilings"):
        assert f"## rock_paper_scissors, held_out opponents: {heading}" in markdown
    assert markdown.index("## held_out opponents: per episode k") < markdown.index("## Held-out game")
    assert Path(written["files"]["success_by_episode-rock_paper_scissors"]).stat().st_size > 0
    assert Path(written["files"]["gains-rock_paper_scissors"]).stat().st_size > 0


def test_a_report_on_tables_without_a_listed_game_or_of_another_policy_is_refused(evaluated, tmp_path):
    import shutil

    from mage import io
    from mage.run import report

    run = evaluated["settings"]
    directory = Path(evaluated["written"]["directory"])
    again = report(run, evaluation_dir=directory, out_dir=tmp_path / "again")  # the tables as they are: reported
    assert again["metrics"] == json.loads(Path(evaluated["written"]["files"]["metrics"]).read_text())
    with pytest.raises(FileNotFoundError, match=r"liars_dice holds no evaluation tables of liars_dice .*eval\.games"):
        report(load_settings([*evaluated["args"][:-1], "eval.games=[rock_paper_scissors,liars_dice]"]),
               evaluation_dir=directory, out_dir=tmp_path / "no")
    # the held-out game's tables of the starting policy beside the checkpoint's own: one report, one policy
    mixed = tmp_path / "mixed"
    shutil.copytree(directory, mixed)
    shutil.rmtree(mixed / "rock_paper_scissors")
    shutil.copytree(Path(run.paths.start_evaluation) / "rock_paper_scissors", mixed / "rock_paper_scissors")
    with pytest.raises(io.IncompatibleFilesError, match="one report is about one policy on every game"):
        report(run, evaluation_dir=mixed, out_dir=tmp_path / "no")
    assert not (tmp_path / "no").exists()


def test_the_experiment_evaluates_the_runs_final_checkpoint_and_tabulates_each_game(evaluated, tmp_path, monkeypatch):
    # experiments/held_out_games.py on the fixture's run: the same checkpoint and start on the game
    # given (eval.games), into a folder of its own; one row per game, read from its report
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "experiments"))
    sys.modules.pop("held_out_games", None)
    import held_out_games

    run_args = [arg for arg in evaluated["args"] if not arg.startswith("eval.games=")]
    out = held_out_games.run(tmp_path / "out", ["rock_paper_scissors"], run_args)
    assert (out / "final" / "rock_paper_scissors" / "held_out.parquet").is_file()
    assert (out / "start" / "rock_paper_scissors" / "held_out.parquet").is_file()
    lines = held_out_games.table(out).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| kuhn_poker (trained on)", "| rock_paper_scissors"]
    written = json.loads((out / "report" / "report.json").read_text())
    section = written["games"]["rock_paper_scissors"]
    now = next(r for r in section["splits"]["held_out"]["opponents"] if r["opponent"] == "all")
    cells = lines[3].split(" | ")
    assert cells[1] == str(now["meta_episodes"]) and cells[3].startswith(f"{now['final_win_rate']:.3f} [")
    # the same tables as the evaluation that the fixture's report came from (same checkpoint, same initial states)
    assert (out / "final" / "rock_paper_scissors" / "held_out.parquet").read_bytes() == \
        (Path(evaluated["written"]["directory"]) / "rock_paper_scissors" / "held_out.parquet").read_bytes()
    assert json.loads((out / "results" / "metrics.json").read_text()) == \
        json.loads((out / "report" / "metrics.json").read_text())  # the final checkpoint's: not the workspace's
    # run again (as after an interruption): a side whose tables are all there is kept, a side missing one is played
    (out / "start" / "rock_paper_scissors" / "held_out.parquet").unlink()
    kept = (out / "final" / "held_out.parquet").stat().st_mtime_ns
    held_out_games.run(tmp_path / "out", ["rock_paper_scissors"], run_args)
    assert (out / "final" / "held_out.parquet").stat().st_mtime_ns == kept
    assert (out / "start" / "rock_paper_scissors" / "held_out.parquet").is_file()
    assert json.loads((out / "report" / "report.json").read_text()) == written
