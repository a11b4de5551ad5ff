"""The Sokoban benchmark scripts that docs/notes/findings.md quotes still run, at toy sizes.

Their figures are not asserted (they are the benchmarks' to measure); what is asserted holds
whatever the data: a finer key of the board matches fewer positions, the commonest of four
moves on a set is at least a quarter of it, pass@3 is at least episode 1's success, and every
rate lies in [0, 1].
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_script(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_local_policy_benchmark_runs_and_its_tables_are_consistent() -> None:
    out = run_script("sokoban_local_policy.py", "--levels", "40", "--test-levels", "12")
    coverage = {}
    for line in out.splitlines():
        match = re.match(r"\| (nothing.*|four neighbours|3x3|5x5) \| ([\d.]+) \| ([\d.]+) \|$", line)
        if match:
            name, accuracy, covered = match.group(1), float(match.group(2)), float(match.group(3))
            assert 0 <= accuracy <= 1 and 0 <= covered <= 1, line
            coverage[name.split(" (")[0]] = covered
            if name.startswith("nothing"):
                assert covered == 1.0, line  # no key: every position answered
    assert coverage["nothing"] >= coverage["four neighbours"] >= coverage["3x3"] >= coverage["5x5"], coverage
    players = re.findall(r"^\| \| (\d) \| ([\d.]+) \| ([\d.]+) \|$", out, flags=re.M)
    assert [boxes for boxes, _, _ in players] == ["1", "2", "3"], out
    assert all(0 <= float(first) <= float(any_of_3) <= 1 for _, first, any_of_3 in players), players


@pytest.mark.e2e
def test_the_board_reading_benchmark_runs_both_phases() -> None:
    out = run_script("sokoban_board.py", "--label", "look_around", "--steps", "2", "--whole-steps", "1", "--every", "1",
                     "--rows", "4", "--whole-rows", "4", "--meta-episodes", "8", "--score-meta-episodes", "4",
                     "--threads", "1")
    majority = float(re.search(r"the commonest first move ([\d.]+)", out).group(1))
    assert 0.25 <= majority <= 1, out
    rows = [line.strip("|").split("|") for line in out.splitlines() if re.match(r"\| \d+ \((short|whole)\)", line)]
    assert [r[0].strip() for r in rows] == ["1 (short)", "2 (short)", "3 (whole)"], out
    for row in rows:
        _, loss, first_cut, nll_cut, first_whole, nll_whole, read_cut, read_whole, _ = (c.strip() for c in row)
        assert math.isfinite(float(loss)) and float(loss) > 0, row
        assert all(0 <= float(v) <= 1 for v in (first_cut, first_whole, read_cut, read_whole)), row
        assert float(nll_cut) > 0 and float(nll_whole) > 0, row
