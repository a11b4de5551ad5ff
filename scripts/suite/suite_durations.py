"""Where the test suite's time goes: the per-test durations of a pytest log written with
``--durations=0`` (e.g. ``time bash scripts/test.sh --durations=0 > suite.log 2>&1``), summed
per file (setup, call and teardown together), longest first, with the sum over all tests
beside pytest's own wall time. The sum exceeds the wall time by the workers' parallelism.

    python scripts/suite/suite_durations.py suite.log --top 20
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: A line of pytest's durations table: "12.34s call     tests/test_x.py::test_y[param]".
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)")
#: pytest's last line: "... in 2972.56s (0:49:32) ..."
WALL = re.compile(r" in (\d+(?:\.\d+)?)s\b")


def durations_by_file(text: str) -> tuple[Counter[str], float | None]:
    """Seconds per test file from a pytest log, and pytest's wall time (None if absent).
    Lines that are not durations are skipped."""
    per_file: Counter[str] = Counter()
    wall = None
    for line in text.splitlines():
        if match := DURATION.match(line):
            per_file[match[3].split("::", 1)[0]] += float(match[1])
        elif line.startswith("=") and (match := WALL.search(line)):
            wall = float(match[1])  # the last summary line wins
    return per_file, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a pytest log written with --durations=0")
    parser.add_argument("--top", type=int, default=20, help="how many files to list (default 20)")
    args = parser.parse_args()
    per_file, wall = durations_by_file(args.log.read_text(errors="replace"))
    if not per_file:
        raise SystemExit(f"{args.log}: no durations found (run pytest with --durations=0)")
    total = sum(per_file.values())
    print("| file | seconds | share |\n|---|---|---|")
    listed = per_file.most_common(args.top)
    for name, seconds in listed:
        print(f"| `{name}` | {seconds:.0f} | {seconds / total:.0%} |")
    rest = total - sum(seconds for _, seconds in listed)
    if rest > 0:
        print(f"| {len(per_file) - len(listed)} other files | {rest:.0f} | {rest / total:.0%} |")
    print(f"\nsum of the tests' durations: {total:.0f} s" + (f"; pytest's wall time: {wall:.0f} s "
                                                            f"(ratio {total / wall:.2f})" if wall else ""))


if __name__ == "__main__":
    main()
