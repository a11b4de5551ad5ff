"""The league against the fixed pool on Kuhn Poker (docs/results.md): the main command's
lifecycle (``dvc exp run``: population, tiny build, training, evaluations, report) in clean
clones of this checkout's HEAD, with and without ``+experiment=kuhn_poker_league``, per seed,
one after the other; then one table of what each run's report and run folder hold.

    python experiments/league_vs_pool.py run WORK --seeds 0 1 [-S key=value ...]   # about 11 min a run on 2 cores
    python experiments/league_vs_pool.py run WORK --arms pool --seeds 0 1          # the main command alone
    python experiments/league_vs_pool.py summary WORK [WORK ...]
    python experiments/league_vs_pool.py run WORK --arms pool --seeds 0 1 -S train.max_staleness=1   # behind the update

``-S`` overrides go to every run (the same budget for both arms). The summary gives per run:
``train.max_staleness``, the training rollouts' invalid-reply rate and KL over the last
iterations (the report's sentence), the training split's gain over the warm start, the
held-out final-episode win rate with its 95% interval, the gain over the warm start, the exploitability of the final checkpoint and of the warm start, the exploitability
per iteration (``train/exploitability``), and the league's ratings after the last iteration.
Several WORK folders give one table (runs of two commits side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent.parent
ARMS = {"pool": [], "league": ["+experiment=kuhn_poker_league"]}


def clone_of(work: Path, arm: str, seed: int) -> Path:
    return work / f"{arm}-seed{seed}"


def run(work: Path, seeds: list[int], overrides: list[str], arms: list[str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                            check=True).stdout.strip()
    for seed in seeds:
        for arm in arms:
            extra = ARMS[arm]
            clone = clone_of(work, arm, seed)
            shutil.rmtree(clone, ignore_errors=True)
            subprocess.run(["git", "clone", "-q", str(HERE), str(clone)], check=True)
            # every run of one call at the commit it started from, whatever is committed meanwhile
            subprocess.run(["git", "checkout", "-q", "--detach", commit], cwd=clone, check=True)
            (clone / ".venv").symlink_to(HERE / ".venv")
            arguments = [item for o in [*extra, f"seed={seed}", *overrides] for item in ("-S", o)]
            print(f"{commit} {arm} seed {seed}: dvc exp run {' '.join(arguments)}", flush=True)
            env = {**os.environ, "PATH": f"{HERE / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
            with open(clone / "run.log", "w") as log:
                done = subprocess.run(["bash", "-c", '. scripts/env.sh && exec python -m dvc exp run "$@"', "run",
                                       *arguments], check=False, cwd=clone, stdout=log, stderr=subprocess.STDOUT,
                                      env=env)
            if done.returncode:
                raise SystemExit(f"{clone}: dvc exp run failed ({done.returncode}); see {clone / 'run.log'}")
            (clone / "commit.txt").write_text(commit + "\n")


def held_out(report: dict, split: str = "held_out") -> tuple[float, list[float], float | None, list[float] | None]:
    """A split's pooled final-episode win rate with its interval, and its gain over the warm start with its interval."""
    body = report["splits"][split]
    pooled = next(r for r in body["opponents"] if r["opponent"] == "all")
    gain = next((r for r in body.get("gains", []) if r["opponent"] == "all"), None)
    return (pooled["final_win_rate"], pooled["final_win_rate_ci"], gain and gain["final_win_rate_gain"],
            gain and gain["final_win_rate_gain_ci"])


def summary(works: list[Path]) -> None:
    print("| arm | seed | commit | train.max_staleness | training: invalid, KL (last iterations) | training split: gain "
          "[95%] | held out: final win [95%] | gain over the warm start [95%] | exploitability: warm start -> final | "
          "per iteration | league after the last iteration (mu) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for clone in (p for work in works for p in sorted(work.iterdir()) if (p / "commit.txt").is_file()):
        arm, seed = clone.name.rsplit("-seed", 1)
        params = yaml.safe_load((clone / "params.yaml").read_text())  # the experiment's, as DVC left it
        report = json.loads((clone / params["paths"]["report"] / "report.json").read_text())
        win, win_ci, gain, gain_ci = held_out(report)
        _, _, train_gain, train_gain_ci = held_out(report, "train")
        sides = report.get("exploitability", {})
        run_dir = clone / params["paths"]["runs"] / params["run"]["name"]
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        curve = " ".join(f"{m['train/exploitability']:.2f}" for m in history if "train/exploitability" in m)
        league = ", ".join(f"{r['player']} {r['mu']:.1f}" for r in report.get("league", [])) or "-"
        exploitability = (f"{sides['start']['exploitability']:.3f} -> {sides['policy']['exploitability']:.3f}"
                          if {"start", "policy"} <= set(sides) else "-")
        training = report.get("training", {})
        training_text = (f"{training['invalid_rate']:.3f}, {training['kl']:.3f} (iterations "
                         f"{training['window'][0]}-{training['window'][1]})" if training.get("window") else "-")
        gain_text = "-" if gain is None else f"{gain:+.3f} [{gain_ci[0]:+.3f}, {gain_ci[1]:+.3f}]"
        train_gain_text = "-" if train_gain is None else \
            f"{train_gain:+.3f} [{train_gain_ci[0]:+.3f}, {train_gain_ci[1]:+.3f}]"
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                                check=True).stdout.strip()  # what ran (commit.txt only says the run ended)
        staleness = params["train"].get("max_staleness", 0)  # a run from before the key was at 0
        print(f"| {arm} | {seed} | {commit} | {staleness} | {training_text} | {train_gain_text} | {win:.3f} "
              f"[{win_ci[0]:.3f}, {win_ci[1]:.3f}] | {gain_text} | {exploitability} | {curve} | {league} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "summary"])
    parser.add_argument("work", type=Path, nargs="+",
                        help="where the clones go (outside this checkout); summary: one or more")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="an override for every run")
    args = parser.parse_args()
    if args.command == "run":
        if len(args.work) != 1:
            parser.error("run takes one WORK folder")
        args.work[0].mkdir(parents=True, exist_ok=True)
        run(args.work[0], args.seeds, args.overrides, args.arms)
    summary(args.work)


if __name__ == "__main__":
    main()
