"""How well does a Sokoban policy play its turns? A dense reading of evaluation tables.

Success on 2-box levels is a rare, all-or-nothing outcome: at the tiny model's 24%, even 1024
levels resolve a change only to about ±0.03. Every valid play turn of an evaluation table
says more. For each one, the board the call saw (its ``observation``) is solved optimally
(``mage.games.sokoban.solver.solve``, a BFS) before and after the turn's moves (its ``action``,
stopping once the level is solved, as the game does), and the turn is scored:

* **fatal**: the level was solvable before the turn and is not after it (a box pushed where
  it can never reach a target);
* **moves gained**: how much shorter the shortest solution became (3 when all three moves
  are optimal; 0 or less for a turn that wanders or undoes), over the turns that are not
  fatal;
* **all optimal**: every move the turn played is on a shortest solution (each one shortened
  it by a move, so the gain equals the moves played).

Turns from a board that is already solved or already unsolvable are left out. (With
``game.params.end_on_deadlock`` the game also stops at a deadlock; a fatal turn is fatal either
way, and its gain is not counted.) A table is averaged per level first (its
``initial_state``), so each level counts once. Every table after the first is paired with the
first by level, as the report pairs success: the mean of the per-level differences, with the
report's bootstrap interval over levels (``mage.stats.group_bootstrap``). The first table
below averages each table over all its levels; the paired one over the levels both tables
score, so their figures can differ a little.

    python benchmarks/sokoban_turns.py START.parquet CHECKPOINT.parquet [...]

The tables are what ``python -m flows evaluate ... --out-dir DIR`` writes (``DIR/train.parquet``)
or a training run's ``rollouts/iteration-*.parquet``; the levels of two tables must be the
same for the pairing (an evaluation with the same ``eval.meta_episodes`` and seed).
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from mage.games.sokoban.level import Level
from mage.games.sokoban.solver import solve
from mage.stats import group_bootstrap

METRICS = ("fatal", "moves_gained", "all_optimal")
# A board row as Level.render draws it: its number, right-aligned (so " 9" beside "10"), a space, the cells.
BOARD_ROW = re.compile(r"\s*\d+ (.*)")


@functools.lru_cache(maxsize=None)
def distance(level: Level) -> int | None:
    """Moves of a shortest solution; None when the level cannot be solved."""
    solution = solve(level)
    return None if solution is None else len(solution)


def board_seen(observation: str) -> Level | None:
    """The board of a Sokoban observation (``Board:``, a column header, then rows that start
    with their number); None when the text holds no board."""
    rows = [match.group(1) for match in map(BOARD_ROW.fullmatch, observation.splitlines()) if match]
    try:
        return Level.from_text("\n".join(rows)) if rows else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Turn:
    """One play turn: the shortest solution's length before and after it (None: unsolvable)."""

    before: int | None
    after: int | None
    moves_played: int  # until the level was solved, as the game stops there

    @property
    def scored(self) -> bool:
        """Whether the turn could still change anything: its board was solvable, not solved."""
        return self.before is not None and self.before > 0

    @property
    def fatal(self) -> bool:
        """The level became unsolvable (meaningful for a scored turn only)."""
        return self.after is None

    @property
    def moves_gained(self) -> int | None:
        """How much shorter the shortest solution became; None when either end is unsolvable."""
        return None if self.before is None or self.after is None else self.before - self.after

    @property
    def all_optimal(self) -> bool:
        """Every move played shortened the solution by one, the most a move can."""
        return self.moves_played > 0 and self.moves_gained == self.moves_played


def play_turn(observation: str, action: str) -> Turn:
    """The solver's distance before and after a turn's moves (comma-separated names)."""
    level = board_seen(observation)
    if level is None:
        return Turn(None, None, 0)
    before, played = distance(level), 0
    for move in filter(None, (name.strip() for name in action.split(","))):
        if level.is_solved:
            break
        level, played = level.move(move)[0], played + 1
    return Turn(before, distance(level), played)


def per_level(table: pl.DataFrame) -> pl.DataFrame:
    """Per level (``initial_state``): scored turns, and the means of the three turn metrics
    (moves gained over the non-fatal turns; null where a level has none)."""
    plays = table.filter((pl.col("phase") == "play") & pl.col("valid"))
    rows = []
    for level, observation, action in zip(plays["initial_state"], plays["observation"], plays["action"]):
        turn = play_turn(observation, action or "")
        if turn.scored:
            gained = turn.moves_gained
            rows.append((level, float(turn.fatal), None if gained is None else float(gained), float(turn.all_optimal)))
    schema = {"initial_state": pl.String, "fatal": pl.Float64, "moves_gained": pl.Float64, "all_optimal": pl.Float64}
    turns = pl.DataFrame(rows, schema=schema, orient="row")
    return turns.group_by("initial_state").agg(pl.len().alias("turns"), *(pl.col(m).mean() for m in METRICS))


@dataclass(frozen=True)
class Paired:
    """A metric on the levels two tables both score."""

    start: float       # the first table's mean over those levels
    other: float       # the other table's
    difference: float  # the mean of the per-level differences, other - start
    interval: tuple[float, float] | None  # its 95% bootstrap interval over levels
    levels: int


def paired(start: pl.DataFrame, other: pl.DataFrame, metric: str) -> Paired:
    """``metric`` of two :func:`per_level` tables, paired by level."""
    joined = start.join(other, on="initial_state", suffix="_other").drop_nulls([metric, f"{metric}_other"])
    before, after = joined[metric].to_numpy(), joined[f"{metric}_other"].to_numpy()
    if not len(before):
        return Paired(math.nan, math.nan, math.nan, None, 0)
    differences = after - before
    return Paired(float(before.mean()), float(after.mean()), float(differences.mean()),
                  group_bootstrap(differences, np.ones(len(differences))), len(differences))


def number(value: float | None) -> str:
    """A mean as printed; nan for a table without scored turns (polars' mean of nothing is None)."""
    return f"{math.nan if value is None else value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="+", type=Path, help="evaluation tables; the first is the baseline")
    args = parser.parse_args()
    levels = [per_level(pl.read_parquet(path)) for path in args.tables]
    print(f"# {platform.node()}, {platform.machine()}, Python {platform.python_version()}")
    print("| table | levels | scored turns | fatal | moves gained | all optimal |")
    print("|---|---|---|---|---|---|")
    for path, table in zip(args.tables, levels):
        means = " | ".join(number(table[m].mean()) for m in METRICS)
        print(f"| {path} | {len(table)} | {table['turns'].sum()} | {means} |")
    if len(levels) > 1:
        print()
        print("| table, against the first (paired by level) | metric | first | this | this - first [95%] | levels |")
        print("|---|---|---|---|---|---|")
        for path, table in zip(args.tables[1:], levels[1:]):
            for metric in METRICS:
                pair = paired(levels[0], table, metric)
                low, high = pair.interval or (math.nan, math.nan)
                print(f"| {path} | {metric} | {number(pair.start)} | {number(pair.other)} | "
                      f"{pair.difference:+.3f} [{low:+.3f}, {high:+.3f}] | {pair.levels} |")


if __name__ == "__main__":
    main()
