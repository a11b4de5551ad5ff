"""benchmarks/sokoban_turns.py on hand-made levels whose shortest solutions are counted by hand.

ROUND: the box is left of the player on the top row, the target at the right end. The box
can only go right (left is the corner, and nothing stands above it to push it down), so the
player walks round it, down, left, left, up (4 moves), then pushes it right 3 times: 7.
PUSH_OFF: one push right solves it; a second push would take the box off the target into
the corner beyond, which the game never plays, as it ends the episode when solved.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sokoban import episode_for
from test_sokoban_benchmarks import run_script

from mage.games.sokoban import solve
from mage.games.sokoban.generator import generate_level
from mage.games.sokoban.level import MOVE_NAMES, Level

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import sokoban_turns  # noqa: E402

ROUND = """
#######
#_$@_.#
#_____#
#######
"""
PUSH_OFF = """
######
#@$._#
######
"""
SOLVED = """
####
#*@#
####
"""


def observation(level_text: str) -> str:
    """What the rollout engine records as the call's observation, from the game itself."""
    return episode_for(Level.from_text(level_text)).observation()


def table(turns: list[tuple[str, str, bool]]) -> pl.DataFrame:
    """Play rows of (level, action, valid), plus a reflection that must be ignored."""
    rows = [{"initial_state": text, "phase": "play", "observation": observation(text), "action": action, "valid": valid}
            for text, action, valid in turns]
    rows.append({"initial_state": ROUND, "phase": "reflect", "observation": "", "action": None, "valid": True})
    return pl.DataFrame(rows)


def test_turns_are_scored_against_hand_counted_solutions():
    assert sokoban_turns.distance(Level.from_text(ROUND)) == 7
    down_left_left = sokoban_turns.play_turn(observation(ROUND), "down, left, left")
    assert (down_left_left.before, down_left_left.after, down_left_left.fatal) == (7, 4, False)
    assert down_left_left.all_optimal and sokoban_turns.play_turn(observation(ROUND), "down").all_optimal
    assert not sokoban_turns.play_turn(observation(ROUND), "down, up").all_optimal  # gains 0 in 2 moves
    assert not sokoban_turns.play_turn(observation(ROUND), "up").all_optimal  # blocked: a move played, none gained
    assert sokoban_turns.play_turn(observation(ROUND), "left").fatal  # the box into the corner
    assert sokoban_turns.play_turn(observation(ROUND), "right, left, right").moves_gained == -1  # 8 from (1,4)
    push_off = sokoban_turns.play_turn(observation(PUSH_OFF), "right, right")
    assert (push_off.after, push_off.moves_gained, push_off.fatal) == (0, 1, False)  # it stops when solved
    assert push_off.moves_played == 1 and push_off.all_optimal
    assert not sokoban_turns.play_turn(observation(SOLVED), "left").scored


def test_levels_are_paired_and_averaged_by_hand():
    start = sokoban_turns.per_level(table([
        (ROUND, "down, left, left", True),   # gains 3, all optimal
        (ROUND, "left", True),               # fatal
        (ROUND, "up, up", False),            # invalid: not scored
        (PUSH_OFF, "right, right", True),    # gains 1, all optimal
        (SOLVED, "left", True),              # already solved: not scored
    ]))
    other = sokoban_turns.per_level(table([
        (ROUND, "right, left, right", True),  # gains -1
        (PUSH_OFF, "right", True),
    ]))
    by_level = {row["initial_state"]: row for row in start.iter_rows(named=True)}
    assert set(by_level) == {ROUND, PUSH_OFF}
    assert (by_level[ROUND]["turns"], by_level[ROUND]["fatal"], by_level[ROUND]["moves_gained"],
            by_level[ROUND]["all_optimal"]) == (2, 0.5, 3.0, 0.5)
    # per metric: the start's and the other's means over the two levels, and ROUND's
    # difference (PUSH_OFF's is 0 in all three)
    expected = {"fatal": (0.25, 0.0, -0.5), "moves_gained": (2.0, 0.0, -4.0), "all_optimal": (0.75, 0.5, -0.5)}
    for metric, (before, after, round_difference) in expected.items():
        pair = sokoban_turns.paired(start, other, metric)
        assert (pair.start, pair.other, pair.difference, pair.levels) == pytest.approx(
            (before, after, round_difference / 2, 2))
        # Two levels: a resample's mean is ROUND's difference (both draws ROUND, a chance of
        # 1/4), PUSH_OFF's 0 (1/4) or their mean, so the 2.5% and 97.5% points are the two.
        assert pair.interval == pytest.approx((round_difference, 0.0))


def test_the_script_prints_the_paired_table(tmp_path):
    start, other = tmp_path / "start.parquet", tmp_path / "other.parquet"
    table([(ROUND, "down, left, left", True), (PUSH_OFF, "right", True)]).write_parquet(start)
    table([(ROUND, "left", True), (PUSH_OFF, "right", True)]).write_parquet(other)
    out = run_script("sokoban_turns.py", str(start), str(other))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("|")]
    fatal = next(row for row in rows if row[:2] == [str(other), "fatal"])
    assert (float(fatal[2]), float(fatal[3]), fatal[4].split()[0], fatal[5]) == (0.0, 0.5, "+0.500", "2")
    summary = next(row for row in rows if row[0] == str(start) and len(row) == 6 and row[1] == "2")
    assert summary[2:] == ["2", "0.000", "2.000", "1.000"]  # gains 3 and 1, each turn all optimal


def test_a_table_without_scored_turns_prints_nan(tmp_path):
    path = tmp_path / "invalid.parquet"
    table([(ROUND, "up", False)]).write_parquet(path)
    rows = [line for line in run_script("sokoban_turns.py", str(path)).splitlines() if line.startswith(f"| {path}")]
    assert rows == [f"| {path} | 0 | 0 | nan | nan | nan |"]


@given(st.text(alphabet="#@$.*+_ \n0123456789ABCDEFBoard:", max_size=120))
def test_reading_a_board_never_raises(text):
    level = sokoban_turns.board_seen(text)
    assert level is None or isinstance(level, Level)


def shortest_by_brute_force(level: Level) -> int | None:
    """Moves of a shortest solution by a plain breadth-first search over the positions the
    game's own moves reach (no pruning, no solver): the independent check of ``solve``."""
    seen = {(level.player, level.boxes)}
    frontier, depth = [level], 0
    while frontier:
        if any(position.is_solved for position in frontier):
            return depth
        following = []
        for position in frontier:
            for name in MOVE_NAMES:
                after, _ = position.move(name)
                if (after.player, after.boxes) not in seen:
                    seen.add((after.player, after.boxes))
                    following.append(after)
        frontier, depth = following, depth + 1
    return None


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.sampled_from([(6, 6), (11, 7)]))
def test_a_generated_levels_observation_reads_back_as_the_level(seed, boxes, dim):
    """Also on a board of 10 rows or more, whose row numbers are drawn right-aligned. The
    solver's moves, played in the game, solve the level; on the 6x6 rooms (a few hundred
    positions) no solution is shorter than theirs."""
    level, optimal_moves = generate_level(seed, dim, num_boxes=boxes)
    assert sokoban_turns.board_seen(episode_for(level).observation()) == level
    moves = solve(level)
    episode = episode_for(level)
    episode.apply_agent_actions([MOVE_NAMES.index(m) for m in moves])
    assert episode.solved and len(episode.history) == len(moves)  # solved only at its last move
    assert sokoban_turns.distance(level) == len(moves) == optimal_moves
    if dim == (6, 6):
        assert shortest_by_brute_force(level) == len(moves)


def test_the_solver_is_as_short_as_a_brute_force_search():
    """The hand-counted levels, and generated levels of each box count, against a search
    that knows only the moves: a longer solution than the shortest, or one that does not
    solve the level, fails."""
    assert shortest_by_brute_force(Level.from_text(ROUND)) == 7  # counted by hand above
    assert shortest_by_brute_force(Level.from_text(PUSH_OFF)) == 1
    for boxes in (1, 2, 3):
        for seed in range(5):
            level, _ = generate_level(seed, (6, 6), num_boxes=boxes)
            moves = solve(level)
            position = level
            for name in moves:
                position, _ = position.move(name)
            assert position.is_solved and len(moves) == shortest_by_brute_force(level), (boxes, seed)
