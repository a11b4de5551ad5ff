"""Each link of the chain that carries what episode 1 showed into episode 2, measured on
rock-paper-scissors tables (docs/results.md, "Rock-paper-scissors"; the tests of each link are in
tests/test_rock_paper_scissors.py):

1. the prompt: episode 2's prompts that say what the opponent played in episode 1;
2. the reflection: reflections that say the opponent's move right, and name the move that beats it;
   the thought before episode 2's move that repeats the last reflection's plan (where there is one);
3. the advantage: the mean advantage (its episode and step terms) of episode 2's moves that beat
   what the opponent played in episode 1 ("used it") and of the others; of every call per episode;
4. the policy: the share of episode 2's valid moves that used it (a policy that ignores it: 1/3).

    python experiments/adaptation_chain.py artifacts/runs/<run>            # the training rollouts, per iteration
    python experiments/adaptation_chain.py artifacts/eval/<run>/start/train.parquet artifacts/eval/<run>/final/train.parquet

Links 1 and 4 need opponents that play one move (the training population): a table of other
opponents is measured on its ``always_*`` meta-episodes only. Prints Markdown.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import polars as pl

BEATS = {"rock": "paper", "paper": "scissors", "scissors": "rock"}
THEIR_MOVE = re.compile(r"Opponent: (rock|paper|scissors)")


def _plan(prompt: str) -> str | None:
    reflections = [line for line in prompt.splitlines() if line.startswith("Your reflection: ")]
    return reflections[-1].split("Next time: ", 1)[1] if reflections and "Next time: " in reflections[-1] else None


def _share(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def links(table: pl.DataFrame) -> dict[str, float | int | None]:
    """The chain's figures for one table (see the module docstring); None where it has no rows."""
    table = table.filter(pl.col("opponent").str.starts_with("always_"))
    theirs = pl.col("opponent").str.replace("always_", "")
    reflections = table.filter(pl.col("phase") == "reflect")
    said, planned = [], []
    for row in reflections.iter_rows(named=True):
        move = THEIR_MOVE.findall(row["prompt"].split("just ended")[-1])
        if move:
            said.append(f"the opponent played {move[-1]}." in row["response"])
            planned.append(f"so play {BEATS[move[-1]]}." in row["response"])
    second = table.filter((pl.col("phase") == "play") & (pl.col("episode") == 2)).with_columns(theirs.alias("theirs"))
    shown, thought, used, advantage_used, advantage_not = [], [], [], [], []
    scored = "advantage" in second.columns
    for row in second.iter_rows(named=True):
        shown.append(f"the opponent played {row['theirs']}:" in row["prompt"])
        plan = _plan(row["prompt"])
        if plan is not None and "<think>" in row["response"]:
            thought.append(f"<think>My plan: {plan}</think>" in row["response"])
        if row["valid"]:
            uses = row["action"] == BEATS[row["theirs"]]
            used.append(uses)
            if scored:
                (advantage_used if uses else advantage_not).append(row["advantage"])
    out: dict[str, float | int | None] = {
        "episode 2 moves": second.height,
        "prompt shows it": _share(shown),
        "reflection says it": _share(said),
        "reflection plans the beating move": _share(planned),
        "thought repeats the plan": _share(thought),
        "move uses it": _share(used),
        "advantage: moves that used it": _mean(advantage_used),
        "advantage: the others": _mean(advantage_not),
    }
    if scored:
        play = table.filter(pl.col("phase") == "play")
        for episode in sorted(set(play["episode"].to_list())):
            mine = play.filter(pl.col("episode") == episode)
            out[f"advantage: episode {episode}"] = float(mine["advantage"].mean())
            out[f"episode term: episode {episode}"] = float(mine["advantage_episode"].mean())
        out["invalid replies"] = float((~play["valid"]).mean())
    return out


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:+.2f}" if abs(value) > 1 else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="a run directory (its rollouts) or trajectory tables")
    args = parser.parse_args(argv)
    rows: list[tuple[str, dict]] = []
    for path in args.paths:
        tables = sorted((path / "rollouts").glob("iteration-*.parquet")) if path.is_dir() else [path]
        if not tables:
            sys.exit(f"error: {path}: no rollouts/iteration-*.parquet and not a table")
        rows += [(str(table), links(pl.read_parquet(table))) for table in tables]
    columns = list(dict.fromkeys(key for _, figures in rows for key in figures))
    print("| table | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, figures in rows:
        print(f"| {name} | " + " | ".join(_cell(figures.get(key)) for key in columns) + " |")


if __name__ == "__main__":
    main()
