"""experiments/paper_table.py: its smallest setting runs end to end and resumes, and its
figures agree with a second computation on tables of known outcomes (scripted players)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from conftest import process_ended

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))


@pytest.mark.e2e
def test_smoke_runs_every_game_and_method_and_resumes(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, str(EXPERIMENTS / "paper_table.py"), "--smoke", "--out", str(out)]
    # two worker processes, one per core of the CI machine; the resume below runs without them
    done = subprocess.run([*command, "--jobs", "2", "--threads", "1"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "table.json").read_text())
    assert set(summary["games"]) == {"kuhn_poker", "tic_tac_toe", "sokoban"}
    for body in summary["games"].values():
        assert set(body["methods"]) == {"mage", "grpo"}
        assert all(len(m["train"]["final_per_seed"]) == 2 for m in body["methods"].values())
    assert set(summary["ablations"]) == {"MAGE (stationary groups, global anchor)", "mixed groups", "local anchor"}
    # 3 games x 2 methods x (2 rates + 1 more seed) + 2 ablations x 2 seeds
    assert len(summary["runs"]) == 3 * 2 * 2 + 2 * 2 and len(list((out / "runs").glob("*.json"))) == 22
    for game in summary["games"]:
        assert f"| {game} | MAGE |" in done.stdout and f"| {game} | GRPO |" in done.stdout
    # every run's final success is what its evaluation table says (counted here by hand)
    for run in summary["runs"]:
        for split in ("train", "held_out"):
            table = pl.read_parquet(out / "evaluations" / run["name"] / f"{split}.parquet")
            finals = table.filter(pl.col("phase") == "play").group_by("meta_id").agg(pl.col("won").sort_by("episode").last())
            assert run["figures"][split]["final_win_rate"] == pytest.approx(finals["won"].mean())
            assert run["figures"][split]["meta_episodes"] == finals.height

    # again, with --jobs 1 (no worker processes) and one run's result lost: only that run trains again
    lost = next(r["name"] for r in summary["runs"]
                if r["spec"]["game"] == "kuhn_poker" and r["spec"]["algo"] == "grpo" and r["spec"]["seed"] == 1)
    (out / "runs" / f"{lost}.json").unlink()
    again = subprocess.run([*command, "--games", "kuhn_poker"],
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "# 4 of 4 runs kept" in again.stderr and "# 5 of 6 runs kept" in again.stderr
    trained = [line for line in again.stderr.splitlines() if ": trained " in line]
    assert len(trained) == 1 and trained[0].startswith(f"# {lost}: trained")
    assert (out / "runs" / f"{lost}.json").is_file()


@pytest.mark.e2e
def test_workers_end_with_a_killed_driver(tmp_path):
    """A driver killed mid-run (SIGKILL: no clean-up of its own runs) leaves no worker running."""
    driver = (f"import os, sys, time; sys.path.insert(0, {str(EXPERIMENTS)!r}); from paper_table import worker_pool\n"
              "pool = worker_pool(1)\n"
              "print(pool.submit(os.getpid).result(), flush=True)\n"
              "pool.submit(time.sleep, 600); time.sleep(3); os.kill(os.getpid(), 9)\n")
    # to a file, not a pipe: a worker left behind would hold a pipe open
    printed = tmp_path / "printed"
    with printed.open("w") as out:
        running = subprocess.Popen([sys.executable, "-c", driver], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not printed.read_text().strip() and running.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    worker = psutil.Process(int(printed.read_text().split()[0]))  # alive: the driver waits 3 s
    assert running.wait(timeout=120) == -9, printed.read_text()[-3000:]
    deadline = time.monotonic() + 30
    while not process_ended(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_ended(worker)


@pytest.fixture(scope="module")
def scripted_tables(tmp_path_factory):
    """Kuhn Poker evaluations of three scripted players on the same initial states: the
    'warm start' (random) and two 'runs' (random with other seeds, and a rule player)."""
    from mage.backends.scripted import ScriptedBackend
    from mage.evaluation.play import evaluate
    from mage.population.manifest import seed_population, write_manifest
    from mage.rollout import write_trajectories
    from mage.settings import load_settings

    directory = tmp_path_factory.mktemp("scripted")
    settings = load_settings(["eval.meta_episodes=48"])
    manifest = write_manifest(seed_population(settings, progress=False), directory / "population.json")
    players = {"warm": ScriptedBackend("random", seed=0), "run0": ScriptedBackend("random", seed=1),
               "run1": ScriptedBackend("aggressive", seed=2)}
    tables = {}
    for name, backend in players.items():
        tables[name] = {split: str(write_trajectories(
            evaluate(settings, backend, dataclasses.replace(settings.eval, split=split), progress=False),
            directory / name / f"{split}.parquet")) for split in ("train", "held_out")}
    return tables, str(manifest), settings.eval.episodes


def by_hand(path: str) -> pl.DataFrame:
    """Per meta-episode: first and final episode won, from the play rows."""
    play = pl.read_parquet(path).filter(pl.col("phase") == "play")
    return play.group_by("meta_id").agg(pl.col("won").sort_by("episode").first().alias("first"),
                                        pl.col("won").sort_by("episode").last().alias("final")).sort("meta_id")


def wilson_by_hand(wins: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_figures_and_seed_means_match_a_second_computation(scripted_tables):
    from paper_table_report import across_seeds, figures, read_tables

    from mage.population.manifest import load_manifest

    tables, manifest, episodes = scripted_tables
    manifest = load_manifest(manifest)
    warm = read_tables(tables["warm"])
    runs = [{"spec": {"seed": seed}, "figures": figures(tables[f"run{seed}"], manifest, episodes, warm)}
            for seed in (0, 1)]
    finals, starts = [], by_hand(tables["warm"]["train"])
    for seed, run in enumerate(runs):
        mine = by_hand(tables[f"run{seed}"]["train"])
        row = run["figures"]["train"]
        assert row["final_win_rate"] == pytest.approx(mine["final"].mean())
        assert row["first_win_rate"] == pytest.approx(mine["first"].mean())
        assert row["win_rate_gain"] == pytest.approx(mine["final"].mean() - mine["first"].mean())
        # paired by initial state: the same meta-episode ids were played by the warm start
        assert row["gain_over_start"] == pytest.approx(mine["final"].mean() - starts["final"].mean())
        low, high = wilson_by_hand(int(mine["final"].sum()), mine.height)
        assert row["final_win_rate_ci"] == pytest.approx([low, high])
        finals.append(mine)
    assert 0 < finals[0]["final"].mean() != finals[1]["final"].mean()  # the check is not vacuous

    seeds = across_seeds(runs)["train"]
    rates = [f["final"].mean() for f in finals]
    assert seeds["final"] == pytest.approx(sum(rates) / 2)
    assert seeds["spread"] == pytest.approx(abs(rates[0] - rates[1]))
    wins, n = sum(int(f["final"].sum()) for f in finals), sum(f.height for f in finals)
    assert seeds["final_pooled"] == pytest.approx(wins / n)
    assert seeds["final_pooled_ci"] == pytest.approx(list(wilson_by_hand(wins, n)))
    assert seeds["vs_ceiling"] == pytest.approx(seeds["final"] / runs[0]["figures"]["train"]["win_ceiling_final"])


def test_the_learning_rate_is_chosen_on_the_selection_states(scripted_tables):
    from paper_table import choose_rates

    tables, _, _ = scripted_tables
    success = {name: by_hand(t["train"])["final"].mean() for name, t in tables.items()}
    better, worse = sorted(("run0", "run1"), key=success.get, reverse=True)
    sweep = [{"spec": {"game": "kuhn_poker", "algo": "mage", "learning_rate": rate}, "tables": {"selection": tables[name]["train"]}}
             for rate, name in ((1e-4, worse), (3e-4, better))]
    sweep += [{"spec": {"game": "kuhn_poker", "algo": "grpo", "learning_rate": rate}, "tables": {"selection": tables["run0"]["train"]}}
              for rate in (5e-4, 2e-4)]
    assert choose_rates(sweep) == {("kuhn_poker", "mage"): 3e-4, ("kuhn_poker", "grpo"): 2e-4}  # ties: the smaller
    assert sweep[1]["selection_success"] == pytest.approx(success[better])


def test_targets_are_judged_as_the_issue_states():
    from paper_table_report import targets

    def method(final, spread, held, gain, ceiling=0.6):
        return {"train": {"final": final, "spread": spread, "ceiling": ceiling, "vs_ceiling": final / ceiling,
                          "first_to_final": gain}, "held_out": {"final": held}}

    table = {"mage": method(0.55, 0.02, 0.50, 0.10), "lamer": method(0.50, 0.01, 0.4, 0.05),
             "grpo": method(0.54, 0.03, 0.4, 0.12)}
    met = {what: ok for what, ok, _ in targets("kuhn_poker", table)}
    assert met["final success >= 0.9 of the per-k ceiling (training opponents)"] is True  # 0.55 / 0.6 = 0.917
    assert met["ahead of LaMer by more than the seeds' spread"] is True  # +0.05 > 0.02
    assert met["ahead of GRPO by more than the seeds' spread"] is False  # +0.01 < 0.03
    assert met["held-out success within 0.1 of training"] is True
    assert met["first-to-final gain positive and above the single-episode methods'"] is False  # 0.10 < GRPO's 0.12
    assert all("ceiling" not in what for what, _, _ in targets("sokoban", table))  # no ceiling target on Sokoban


def test_success_by_k_is_printed_beside_the_three_ceilings_and_plotted(tmp_path, capsys):
    from paper_table_report import plot_by_k, print_by_k

    def split(passes, ceilings=(0.3, 0.6, 0.9)):
        return {"by_k": [{"k": k, "pass_at_k": p, "pass_at_k_ci": [p - 0.1, p + 0.1], "memoryless": ceilings[0],
                          "adaptive": ceilings[1], "known_opponent": ceilings[2]} for k, p in enumerate(passes, 1)]}

    warm = {"train": split([0.3, 0.5]), "held_out": split([0.2, 0.4])}
    runs = [{"spec": {"game": "g", "algo": algo, "seed": seed, "variant": ""},
             "figures": {"train": split([0.3, 0.9 if algo == "mage" else 0.55]), "held_out": split([0.2, 0.5])}}
            for algo in ("mage", "gigpo") for seed in (1, 0)]
    by_k = print_by_k("g", warm, runs, ["mage", "gigpo"])
    printed = capsys.readouterr().out
    assert "| memoryless ceiling |  | 0.300 | 0.300 | 0.300 | 0.300 |" in printed
    assert "| warm start | - | 0.300 [0.200, 0.400] | 0.500 [0.400, 0.600] |" in printed
    # each method's seeds in order, its own row
    assert printed.index("| MAGE | 0 | 0.300") < printed.index("| MAGE | 1 |") < printed.index("| GiGPO | 0 |")
    assert "| GiGPO | 1 | 0.300 [0.200, 0.400] | 0.550 [0.450, 0.650] |" in printed
    assert [p["policy"] for p in by_k["policies"]] == ["warm start", "MAGE", "MAGE", "GiGPO", "GiGPO"]
    plot_by_k(tmp_path / "by_k.png", "g", by_k)
    assert (tmp_path / "by_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a game without the memoryless and adaptive ceilings prints nothing
    none = {"train": {"by_k": [dict(row, adaptive=None) for row in warm["train"]["by_k"]]}, "held_out": warm["held_out"]}
    assert print_by_k("g", none, runs, ["mage"]) == {} and capsys.readouterr().out == ""
