"""scripts/suite/suite_durations.py: per-file sums of a pytest durations table, against sums
worked out by hand, and any text read without an error."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "suite"))
from suite_durations import durations_by_file  # noqa: E402

LOG = """\
........ [100%]
============================= slowest durations ==============================
571.10s setup    tests/test_a.py::test_one
134.90s call     tests/test_a.py::test_two[x y]
0.50s teardown tests/test_a.py::test_two[x y]
12.00s call     tests/test_b.py::test_three
(2 durations < 0.005s hidden.  Use -vv to show these durations.)
12.00s in a line that is not a duration
=========== 3 passed, 1 skipped, 40 warnings in 2972.56s (0:49:32) ===========
"""


def test_each_file_sums_its_setup_call_and_teardown():
    per_file, wall = durations_by_file(LOG)
    assert dict(per_file) == {"tests/test_a.py": 571.1 + 134.9 + 0.5, "tests/test_b.py": 12.0}
    assert wall == 2972.56


def test_a_log_without_durations_gives_nothing():
    assert durations_by_file("4 passed in 3.5s\n") == ({}, None)


@given(st.text())
def test_any_text_is_read_without_an_error(text):
    per_file, wall = durations_by_file(text)
    assert all(seconds >= 0 for seconds in per_file.values())
    assert wall is None or wall >= 0
