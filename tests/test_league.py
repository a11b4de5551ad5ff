"""The league (mage.population.league, population.league): ratings against openskill's own updates, PFSP
weights by their formula, who joins and who leaves, and a training run whose snapshots play,
stay on disk while they do, and resume bitwise."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from conftest import defaults, prefect_home
from openskill.models import PlackettLuce

from mage import io
from mage.opponents import MODEL_OPPONENT
from mage.population import league

LEAGUE = dataclasses.replace(defaults().population.league, enabled=True, snapshot_every=2, max_size=2, share=0.5,
                             evict="oldest", pfsp_power=2.0)


def test_ratings_follow_openskill_s_updates_in_order():
    model = PlackettLuce()
    agent, a, b = model.rating(), model.rating(), model.rating()
    [[agent], [a]] = model.rate([[agent], [a]], ranks=[0, 1])  # the agent wins against a
    [[agent], [b]] = model.rate([[agent], [b]], ranks=[1, 0])  # loses against b
    [[agent], [a]] = model.rate([[agent], [a]], ranks=[0, 0])  # draws against a
    found = league.rated(league.initial(["a", "b"]), [("a", league.WIN), ("b", league.LOSS), ("a", league.DRAW)])
    assert found == {"agent": (agent.mu, agent.sigma), "a": (a.mu, a.sigma), "b": (b.mu, b.sigma)}
    with pytest.raises(ValueError, match="1 \\(win\\), 0.5 \\(draw\\) or 0 \\(loss\\)"):
        league.rated(found, [("a", 2.0)])


def test_pfsp_weighs_the_opponents_the_agent_does_not_beat():
    ratings = league.rated(league.initial(["weak", "strong"]), [("weak", league.WIN)] * 5 + [("strong", league.LOSS)] * 5)
    p = {name: league.win_probability(ratings, name) for name in ("weak", "strong")}
    assert p["weak"] > 0.5 > p["strong"]
    weights = league.pfsp_weights(ratings, ["weak", "strong"], power=2.0)
    raw = {name: (1 - p[name]) ** 2 for name in p}
    assert weights == pytest.approx({name: raw[name] / sum(raw.values()) for name in raw}, abs=1e-12)
    assert league.pfsp_weights(ratings, ["weak", "strong"], power=0.0) == {"weak": 0.5, "strong": 0.5}


def table_of(results: list[tuple[str, bool, bool]]) -> pl.DataFrame:
    """A training table's ends of episodes (and a call before each that ended nothing)."""
    rows = []
    for meta, (opponent, won, draw) in enumerate(results):
        rows.append({"meta_id": meta, "episode": 1, "phase": "play", "done": False, "opponent": opponent,
                     "won": won, "draw": draw})
        rows.append({"meta_id": meta, "episode": 1, "phase": "play", "done": True, "opponent": opponent,
                     "won": won, "draw": draw})
    return pl.DataFrame(rows, schema={"meta_id": pl.Int64, "episode": pl.Int64, "phase": pl.String, "done": pl.Boolean,
                                      "opponent": pl.String, "won": pl.Boolean, "draw": pl.Boolean})


def test_snapshots_join_and_the_oldest_or_lowest_rated_leaves():
    population = list(defaults("game=kuhn_poker").population.train.values())
    state = league.LeagueState.start(population)
    assert state.members == () and set(state.ratings) == {"agent", "conservative", "aggressive", "intermediate"}
    assert league.training_entries(population, state, LEAGUE, "kuhn_poker") == population  # no snapshot yet
    results = [("conservative", True, False), ("aggressive", False, True), ("intermediate", False, False)]
    state = league.advanced(state, table_of(results), 1, "ckpt-1", LEAGUE)  # not a snapshot iteration
    assert state.members == ()
    assert state.ratings == league.rated(league.LeagueState.start(population).ratings,
                                         [("conservative", 1.0), ("aggressive", 0.5), ("intermediate", 0.0)])
    state = league.advanced(state, table_of([]), 2, "ckpt-2", LEAGUE)
    assert [m.id for m in state.members] == ["snapshot-2"] and state.ratings["snapshot-2"] == state.ratings["agent"]
    entries = league.training_entries(population, state, LEAGUE, "kuhn_poker")
    snapshot = entries[-1]
    assert snapshot.opponent == MODEL_OPPONENT and snapshot.share == pytest.approx(0.5)
    assert [e.share for e in entries[:-1]] == pytest.approx([0.5 * e.share for e in population])
    state = league.advanced(state, table_of([("snapshot-2", True, False)] * 3), 4, "ckpt-4", LEAGUE)
    state = league.advanced(state, table_of([("snapshot-4", False, False)] * 3), 6, "ckpt-6", LEAGUE)
    assert [m.id for m in state.members] == ["snapshot-4", "snapshot-6"] and "snapshot-2" not in state.ratings
    # lowest rated: snapshot-6 lost every game to the agent, so it leaves before snapshot-4
    lowest = dataclasses.replace(LEAGUE, evict="lowest_rated")
    beaten = league.advanced(state, table_of([("snapshot-6", True, False)] * 4), 7, "ckpt-7", lowest)
    assert league.advanced(beaten, table_of([]), 8, "ckpt-8", lowest).members[0].id == "snapshot-4"
    # the state is JSON: it reads back exactly
    assert league.LeagueState.from_json(state.to_json()) == state


@pytest.mark.parametrize(("overrides", "named"), [
    (["game=sokoban"], "sokoban has one player"),
    (["engine.backend=scripted"], "a scripted agent has no weights"),
    (["engine.backend=vllm"], "model.lora is not set"),
])
def test_a_league_it_cannot_play_is_refused_naming_the_key(overrides, named):
    """A one-player game, a scripted agent, and vLLM under full fine-tuning (a snapshot's weights
    would replace the agent's in the engine) are refused before any work; vLLM with LoRA is not."""
    from mage.settings import SettingsError, load_settings

    league_on = ["population.league.enabled=true"]
    with pytest.raises(SettingsError, match=f"^population.league.enabled: .*{named}"):
        load_settings([*league_on, *overrides])
    lora = "model.lora={r:8,alpha:16,dropout:0.0,target_modules:[q_proj,v_proj]}"
    assert load_settings([*league_on, "engine.backend=vllm", lora]).population.league.enabled


@pytest.mark.e2e
def test_a_league_run_plays_its_snapshots_and_resumes_bitwise(tiny_model_dir, tmp_path):
    from mage.run import RunLayout, train
    from mage.settings import load_settings

    def settings_in(directory, *extra):
        return load_settings([
            f"model.path={tiny_model_dir}", "model.build=null", "train.iterations=3", "train.mini_batch_size=8",
            "train.keep_checkpoints=1", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
            "engine.sampling.max_new_tokens=6", "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6",
            "train.eval_every=100", "population.league.enabled=true", "population.league.snapshot_every=1",
            "population.league.max_size=2", f"paths.artifacts={directory}", f"paths.results={directory}/results",
            "paths.live=null", *extra])

    whole = settings_in(tmp_path / "whole")
    train(whole, progress=False)
    layout = RunLayout.of(whole)
    records = [league.LeagueState.from_json(r) for r in io.read_json_lines(layout.league)]
    assert [[m.id for m in r.members] for r in records] == [["snapshot-1"], ["snapshot-1", "snapshot-2"],
                                                            ["snapshot-2", "snapshot-3"]]
    assert records[0].members[0].checkpoint == "checkpoints/ckpt-00001"
    tables = {k: pl.read_parquet(layout.rollout(k)) for k in range(1, 4)}
    assert not any(tables[1]["opponent"].str.starts_with("snapshot"))
    played = {k: {o for o in tables[k]["opponent"].unique() if o.startswith("snapshot")} for k in (2, 3)}
    assert played[2] == {"snapshot-1"} and played[3] and played[3] <= {"snapshot-1", "snapshot-2"}
    # the league's snapshots stay on disk, though keep_checkpoints is 1; snapshot-1 left, and its checkpoint with it
    assert sorted(p.name for p in layout.checkpoints.glob("ckpt-*")) == ["ckpt-00002", "ckpt-00003"]
    history = io.read_json_lines(layout.metrics)
    assert "league/snapshot-1/share" not in history[0] and history[1]["league/snapshot-1/share"] == pytest.approx(0.5)
    assert history[2]["league/snapshot-1/share"] + history[2]["league/snapshot-2/share"] == pytest.approx(0.5)
    assert "league/agent/mu" in history[0]
    assert "train/exploitability" in history[0]

    # stopped after iteration 2, with a league line past its checkpoint (a crash after the line was
    # written), then resumed: the same league, tables and metrics, byte for byte
    parted = settings_in(tmp_path / "parted")
    train(parted, progress=False, stop_after=2)
    again = RunLayout.of(parted)
    again.league.write_text(again.league.read_text() + '{"iteration": 9, "members": [], "ratings": {}}\n')
    train(parted, progress=False)
    assert again.league.read_bytes() == layout.league.read_bytes()
    assert again.metrics.read_bytes() == layout.metrics.read_bytes()
    for k in range(1, 4):
        assert pl.read_parquet(again.rollout(k)).equals(tables[k])


@pytest.mark.e2e
def test_a_killed_tic_tac_toe_league_flow_resumes_with_the_same_league(tiny_model_dir, tmp_path, migrated_prefect_db):
    """The README's ``+experiment=tic_tac_toe_league`` at a smoke size, a snapshot joining every
    iteration: ``python -m flows train`` SIGKILLed in iteration 2 (its rollout written, its
    checkpoint not), then started again, ends where the library's uninterrupted loop ends: the
    same league.jsonl (snapshots, ratings), metrics.jsonl, rollout tables and weights, byte for
    byte. The snapshots played Tic-Tac-Toe's other seat from iteration 2 on."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from mage.run import RunLayout, train
    from mage.settings import load_settings

    def overrides(directory):
        return ["+experiment=tic_tac_toe_league", f"model.path={tiny_model_dir}", "model.build=null",
                "train.iterations=3", "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2",
                "engine.episodes=2", "engine.sampling.max_new_tokens=6", "train.eval_every=100",
                "population.league.snapshot_every=1", "population.league.max_size=2", "paths.live=null",
                f"paths.artifacts={directory}", f"paths.results={directory}/results"]

    whole = load_settings(overrides(tmp_path / "whole"))
    assert whole.game.name == "tic_tac_toe" and whole.population.league.enabled
    train(whole, progress=False)

    killed = load_settings(overrides(tmp_path / "killed"))
    layout = RunLayout.of(killed)
    env = os.environ | {"PREFECT_HOME": str(prefect_home(tmp_path / "prefect", migrated_prefect_db))}
    env.pop("PREFECT_API_URL", None)  # the command's own temporary server, as a user's
    command = [sys.executable, "-m", "flows", "train", *overrides(tmp_path / "killed")]
    repo = Path(__file__).resolve().parent.parent
    with open(tmp_path / "first.log", "w") as log:
        flow = subprocess.Popen(command, cwd=repo, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not layout.rollout(2).exists() and time.monotonic() < deadline:
            assert flow.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.05)
    finally:
        os.killpg(flow.pid, signal.SIGKILL)  # no handler, no clean-up: as a lost machine
        flow.wait(30)
    assert layout.rollout(2).exists(), (tmp_path / "first.log").read_text()[-3000:]
    assert not (layout.checkpoints / "ckpt-00002").exists()
    again = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]

    done = RunLayout.of(whole)
    assert layout.league.read_bytes() == done.league.read_bytes()
    assert layout.metrics.read_bytes() == done.metrics.read_bytes()
    for k in (1, 2, 3):
        assert pl.read_parquet(layout.rollout(k)).equals(pl.read_parquet(done.rollout(k))), k
    final = "ckpt-00003/model.safetensors"
    assert (layout.checkpoints / final).read_bytes() == (done.checkpoints / final).read_bytes()
    played = [set(pl.read_parquet(done.rollout(k))["opponent"]) for k in (1, 2, 3)]
    assert not any(o.startswith("snapshot") for o in played[0]) and "snapshot-1" in played[1], played
