"""The main command's Kuhn Poker agent on games it never trained on (docs/results.md, "Held-out
games: the Kuhn Poker agent on Leduc and liar's dice"): the run's final checkpoint and the warm
start it began from, played on the same initial states against Kuhn Poker's held-out opponents
and against the held-out opponents of each game of ``--games`` (``eval.games``: each game's own
prompts and population, the run's model and evaluation settings), reported; then one row per game.

    bash scripts/run.sh                                     # the main command's run, first
    python experiments/held_out_games.py run                # leduc_poker and liars_dice: about 1.5 h on 2 cores
    python experiments/held_out_games.py table artifacts/held-out-games/mage-kuhn_poker-tiny-seed0

``run`` is the library's evaluation and report (:func:`mage.run.evaluate`, :func:`mage.run.report`:
what ``python -m flows evaluate`` and ``report`` run) into a folder of its own, so the main
command's tables and report stay as they are: ``OUT/final`` (the checkpoint's tables, each
held-out game's in a folder of its name), ``OUT/start`` (the warm start's), ``OUT/report``, and
the report's headline numbers in ``OUT/results`` (``paths.results``; the workspace's ``results/``
stays the main command's). Run again after an interruption, it keeps a side (``final``,
``start``) whose every table is there, and plays the other again. ``-S`` overrides go to the
run's settings (``-S seed=1``: that seed's run). ``table`` prints, per game: the checkpoint's and
the warm start's final-episode win rate with their 95% intervals, the paired gain with its
interval, the final mean return, the invalid-reply rates and, where it is measured, the
exploitability of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

GAMES = ("leduc_poker", "liars_dice")
SPLIT = "held_out"  # every opponent of a held-out game is new to the agent; the nightly's split


def played(settings: Any, directory: Path) -> bool:
    """Whether ``directory`` holds every table of an evaluation of ``settings``: the run's game's
    and each held-out game's, with its record and, where it is measured, its exploitability."""
    from mage.evaluation import exploitability
    from mage.run.layout import held_out_dir
    from mage.settings import held_out_settings

    games = [(settings, directory), *((held_out_settings(settings, game), held_out_dir(directory, game))
                                      for game in settings.eval.games)]
    return all((folder / f"{SPLIT}.parquet").is_file() and (folder / f"{SPLIT}-metrics.json").is_file()
               and (not exploitability.measured(game) or (folder / "exploitability.json").is_file())
               for game, folder in games)


def run(out: Path | None, games: list[str], overrides: list[str]) -> Path:
    """Evaluate the run's final checkpoint and its warm start on its game and on ``games``, and
    report the one beside the other; the folder."""
    from mage.run import RunLayout, evaluate, report
    from mage.settings import load_settings

    base = load_settings(overrides)
    out = out or Path(base.paths.artifacts) / "held-out-games" / base.run_name
    settings = load_settings([*overrides, f"eval.games=[{','.join(games)}]", f"paths.results={out / 'results'}"])
    if RunLayout.of(settings).final_checkpoint() is None:
        raise SystemExit(f"no checkpoint of run {settings.run_name} under {RunLayout.of(settings).root}: run the main "
                         "command first (bash scripts/run.sh)")
    final, start = out / "final", out / "start"
    for side, directory in (("the final checkpoint", final), ("the warm start", start)):
        if played(settings, directory):  # an interrupted run's finished side (its records are checked by the report)
            print(f"{side}: every table is in {directory}, kept", flush=True)
        else:
            evaluate(settings, split=SPLIT, out_dir=directory, report=False, start=directory == start)
    report(settings, evaluation_dir=final, start_dir=start, out_dir=out / "report")
    return out


def _rate(value: float | None, interval: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else f"{value:.3f}"


def _gain(value: float, interval: list[float] | None) -> str:
    return f"{value:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else f"{value:+.3f}"


def row(game: str, part: dict[str, Any]) -> str:
    """One game's row: ``part`` is the report's (the run's own game) or its section of a held-out game."""
    body = part["splits"][SPLIT]
    now = next(r for r in body["opponents"] if r["opponent"] == "all")
    start = next(r for r in body["start"]["opponents"] if r["opponent"] == "all")
    gain = next(r for r in body["gains"] if r["opponent"] == "all")
    sides = part.get("exploitability", {})
    exploitability = (f"{sides['start']['exploitability']:.3f} -> {sides['policy']['exploitability']:.3f}"
                      if {"start", "policy"} <= set(sides) else "-")
    return (f"| {game} | {now['meta_episodes']} | {_rate(start['final_win_rate'], start['final_win_rate_ci'])} | "
            f"{_rate(now['final_win_rate'], now['final_win_rate_ci'])} | "
            f"{_gain(gain['final_win_rate_gain'], gain['final_win_rate_gain_ci'])} | "
            f"{start['final_mean_return']:+.2f} -> {now['final_mean_return']:+.2f} | "
            f"{gain['invalid_rate_start']:.3f} -> {gain['invalid_rate']:.3f} | {exploitability} |")


def table(out: Path) -> str:
    """The Markdown table of the report in ``out/report``: the run's game first, then each held-out game."""
    report = json.loads((out / "report" / "report.json").read_text())
    header = ("| game | n | warm start: final win [95%] | checkpoint: final win [95%] | gain [95%] | "
              "final mean return: warm start -> checkpoint | invalid replies: warm start -> checkpoint | "
              "exploitability: warm start -> checkpoint |")
    lines = [header, "|---|---|---|---|---|---|---|---|", row(f"{report['about']['game']} (trained on)", report)]
    lines += [row(game, section) for game, section in report.get("games", {}).items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "table"])
    parser.add_argument("out", type=Path, nargs="?",
                        help="the folder (default for run: paths.artifacts/held-out-games/<run.name>)")
    parser.add_argument("--games", nargs="+", default=list(GAMES), help="the games held out (eval.games)")
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="an override of the run's settings")
    args = parser.parse_args(argv)
    if args.command == "run":
        out = run(args.out, args.games, args.overrides)
    elif args.out is None:
        parser.error("table takes the folder that run wrote")
    else:
        out = args.out
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
