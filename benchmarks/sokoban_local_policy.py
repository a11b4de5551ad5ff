"""How far does the 3x3 patch around the player go on Sokoban? (issue 15, items 1 and 3)

No model: a lookup table stands in for a model that reads the cells around the player and
nothing else. It is fitted on the wanderer's positions on ``--levels`` training levels
(``mage.backends.scripted.WandererRule`` at 0.75) with the optimal solver's moves as labels,
and scored on other levels:

1. how often the most common label of a position's patch is the solver's next move, for the
   four neighbours, the 3x3 patch and the 5x5 patch (coverage: test positions whose patch the
   table saw; the others fall back to the commonest move);
2. how often a player that samples a turn's three moves from the table, given the turn's first
   3x3 patch only (a fallback to the four neighbours, then a random move), solves a level in
   episode 1 and in any of 3 episodes (pass@3, what early stop makes the final episode), on
   1-, 2- and 3-box levels.

This is why the ``look_around`` wanderer (``params/experiment/sokoban_long.yaml``) thinks
that patch: a model that reads it well can be a warm start that solves short levels.

    python benchmarks/sokoban_local_policy.py          # about a minute here
"""

from __future__ import annotations

import argparse
import collections
import platform

import numpy as np

from mage.backends.scripted import wander
from mage.games.sokoban.generator import generate_level
from mage.games.sokoban.level import MOVE_NAMES, Level
from mage.games.sokoban.solver import solve

PLUS = (1, 3, 4, 5, 7)  # of the 3x3 patch in reading order: the four neighbours and the player


def patch(level: Level, radius: int) -> str:
    """The cells around the player in reading order, one symbol each (a table key)."""
    return "".join(level.around_player(radius))


def wander_turn(level: Level, rng: np.random.Generator, solver_probability: float) -> tuple[tuple[str, ...], Level]:
    """One turn of three moves of the wanderer (the solver's moves at probability 1), and the level after it."""
    moves = wander(level, 3, solver_probability, rng)
    for name in moves:
        level = level.move(name)[0]
    return tuple(moves), level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, default=3000)
    parser.add_argument("--test-levels", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    keys = {"four neighbours": lambda lv: "".join(patch(lv, 1)[i] for i in PLUS), "3x3": lambda lv: patch(lv, 1),
            "5x5": lambda lv: patch(lv, 2)}
    first = {name: collections.defaultdict(collections.Counter) for name in keys}  # patch -> next move
    turns = {name: collections.defaultdict(collections.Counter) for name in ("four neighbours", "3x3")}
    test = []
    for seed in range(args.levels + args.test_levels):
        level = generate_level(seed)[0]
        for _ in range(7):  # the turn limit
            plan = solve(level)
            if not plan:
                break
            if seed >= args.levels:
                test.append((level, plan[0]))
            else:
                for name, key in keys.items():
                    first[name][key(level)][plan[0]] += 1
                for name in turns:
                    turns[name][keys[name](level)][wander_turn(level, rng, 1.0)[0]] += 1
            level = wander_turn(level, rng, 0.75)[1]
            if level.is_solved:
                break
    commonest = collections.Counter(m for table in first["3x3"].values() for m in table.elements()).most_common(1)[0][0]
    print(f"machine: {platform.processor() or platform.machine()}; {args.levels} training levels, "
          f"{len(test)} test positions on {args.test_levels} others\n")
    print("| the solver's next move from | accuracy | coverage |\n|---|---|---|")
    print(f"| nothing (the commonest move, {commonest}) | {np.mean([m == commonest for _, m in test]):.3f} | 1.000 |")
    for name, key in keys.items():
        table = first[name]
        guess = [table[key(lv)].most_common(1)[0][0] if key(lv) in table else commonest for lv, _ in test]
        print(f"| {name} | {np.mean([g == m for g, (_, m) in zip(guess, test)]):.3f} | "
              f"{np.mean([key(lv) in table for lv, _ in test]):.3f} |")

    def sampled_turn(level: Level) -> tuple[str, ...]:
        for name in ("3x3", "four neighbours"):
            counts = turns[name].get(keys[name](level))
            if counts:
                options = list(counts)
                weights = np.array([counts[o] for o in options], dtype=float)
                return options[rng.choice(len(options), p=weights / weights.sum())]
        return (MOVE_NAMES[int(rng.integers(4))],)

    print("\n| a player sampling turns from the 3x3 table | boxes | episode 1 solved | pass@3 |\n|---|---|---|---|")
    for boxes in (1, 2, 3):
        solved = []
        for seed in range(100_000, 100_000 + args.test_levels):
            start = generate_level(seed, num_boxes=boxes)[0]
            episodes = []
            for _ in range(3):
                level = start
                for _ in range(7):
                    for move in sampled_turn(level):
                        level = level.move(move)[0]
                    if level.is_solved:
                        break
                episodes.append(level.is_solved)
            solved.append(episodes)
        solved = np.array(solved)
        print(f"| | {boxes} | {solved[:, 0].mean():.3f} | {solved.any(axis=1).mean():.3f} |")


if __name__ == "__main__":
    main()
