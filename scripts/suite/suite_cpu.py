"""Where the test suite's CPU goes: every process a command starts, sampled from /proc, summed
by kind of process (a pytest worker, a Prefect server, a flow command, a Ray worker, DVC,
vLLM's engine, ...) and by the test file that started it.

    # run the suite under the recorder (each process's CPU, its command line and the test
    # that was running when it started: pytest's PYTEST_CURRENT_TEST, inherited)
    python scripts/suite/suite_cpu.py record suite-cpu.jsonl -- bash scripts/test.sh
    python scripts/suite/suite_cpu.py summary suite-cpu.jsonl --top 15

The recorder samples every process of this user started after it, once a second (its own CPU
is in the summary), so a process's last second may be missed; processes that leave the
command's tree (Ray's daemons, re-parented orphans) are counted too. The pytest workers run
their in-process tests themselves: their CPU is one row per worker, not split by test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

#: The recorder's own line in the log (its CPU, and the command's wall time).
RECORDER = "the recorder"

#: What a command line is, first match wins: (pattern on the joined command line, kind).
KINDS: tuple[tuple[str, str], ...] = (
    (r"prefect server start|prefect\.server|uvicorn", "Prefect server"),
    (r"-m flows\b|flow_marking_a_step", "flow command"),
    (r"^ray::|default_worker\.py|ray/_private/workers", "Ray worker"),
    (r"raylet|gcs_server|ray/dashboard|log_monitor|ray/autoscaler|runtime_env/agent|ray start|ray\.util\.client", "Ray daemon"),
    (r"-m dvc\b|/dvc\b", "DVC"),
    (r"(?i)EngineCore|vllm", "vLLM"),  # its processes title themselves VLLM::EngineCore, VLLM::Worker
    (r"chrom", "browser"),
    (r"scripts/run\.sh|scripts/setup\.sh|\bbash\b|\bsh -c\b", "shell"),
    (r"\bgit\b", "git"),
    # pytest itself and its xdist workers (execnet starts them reading their code from stdin);
    # after the others: their command lines may name a pytest temporary directory
    (r"-m pytest(?![-\w])|bin/pytest(?![-\w])|sys\.stdin\.readline|\[pytest-xdist", "pytest"),
    (r"\bpython", "other Python"),
)


def kind_of(command_line: str) -> str:
    """The kind of process a command line (its arguments joined by spaces) runs; "other" if none matches."""
    for pattern, kind in KINDS:
        if re.search(pattern, command_line):
            return kind
    return "other"


def file_of_current_test(current_test: str | None) -> str:
    """The test file in pytest's ``PYTEST_CURRENT_TEST`` ("tests/test_x.py::test_y (call)"); "-" if unset."""
    if not current_test:
        return "-"
    return current_test.split("::", 1)[0].strip() or "-"


def _read(pid: int) -> tuple[int, float, str, str, str | None] | None:
    """Start time (clock ticks), CPU seconds (user + system), command line, name and
    PYTEST_CURRENT_TEST of ``pid``; None once it is gone. The command line is "" for a process
    that has exited and is not yet reaped (a zombie: its final CPU is still there) and for a
    kernel thread."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # from the state on: field N of proc(5) is fields[N - 3]
        started, ticks = int(fields[19]), int(fields[11]) + int(fields[12])  # starttime; utime + stime
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        current = None
        try:
            for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if entry.startswith(b"PYTEST_CURRENT_TEST="):
                    current = entry.split(b"=", 1)[1].decode(errors="replace")
        except OSError:
            pass
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        return started, ticks / os.sysconf("SC_CLK_TCK"), command, name, current
    except (OSError, ValueError, IndexError):
        return None


def record(log: Path, command: list[str], interval: float) -> int:
    """Run ``command``, sampling every new process of this user; write one JSON line per process."""
    before = {(int(p), read[0]) for p in os.listdir("/proc") if p.isdigit() and (read := _read(int(p)))}
    me, uid = os.getpid(), os.getuid()
    seen: dict[tuple[int, int], dict] = {}  # by pid and start time: pids are reused
    child = subprocess.Popen(command)

    def sample() -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
            except OSError:
                continue
            read = _read(pid)
            if read is None:
                continue
            start, cpu, command_line, name, current = read
            if (pid, start) in before:
                continue
            entry = seen.setdefault((pid, start), {"pid": pid, "command": command_line or name, "test": current,
                                                      "cpu": cpu})
            # the latest: an exec or a process title changes the command line; a zombie has none
            # left, and keeps the one it ran under
            entry["cpu"], entry["command"] = max(entry["cpu"], cpu), command_line or entry["command"]

    started = time.monotonic()
    while child.poll() is None:
        sample()
        time.sleep(interval)
    wall = time.monotonic() - started
    own = os.times()
    with log.open("w") as out:
        for entry in seen.values():
            out.write(json.dumps(entry) + "\n")
        out.write(json.dumps({"pid": me, "command": RECORDER, "test": None, "cpu": own.user + own.system,
                              "wall": wall}) + "\n")
    return child.returncode


class Tally(NamedTuple):
    """A recorded log, summed: CPU seconds and processes by kind, CPU seconds of the processes
    the tests started by test file, and the recorded command's wall time (None if absent)."""

    cpu_by_kind: Counter[str]
    processes_by_kind: Counter[str]
    cpu_by_test_file: Counter[str]
    wall: float | None


def tally(text: str) -> Tally:
    """Sum a recorded log; lines that are not a process's entry (a line cut short) are skipped."""
    result = Tally(Counter(), Counter(), Counter(), None)
    wall = None
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            cpu, command = float(entry["cpu"]), str(entry["command"])
        except (ValueError, KeyError, TypeError):
            continue
        if not math.isfinite(cpu) or cpu < 0:
            continue
        if command == RECORDER:
            wall = entry.get("wall") if isinstance(entry.get("wall"), (int, float)) else wall
        kind = RECORDER if command == RECORDER else kind_of(command)
        result.cpu_by_kind[kind] += cpu
        result.processes_by_kind[kind] += 1
        if kind not in ("pytest", RECORDER):
            test = entry.get("test")
            result.cpu_by_test_file[file_of_current_test(test if isinstance(test, str) else None)] += cpu
    return result._replace(wall=wall)


def summary(text: str, top: int) -> str:
    """Markdown tables of a recorded log: CPU by kind of process, and by test file."""
    found = tally(text)
    total = sum(found.cpu_by_kind.values())
    if not total:
        return "no processes recorded"
    lines = [f"CPU in all: {total:.0f} s" + (f" in {found.wall:.0f} s of wall time" if found.wall else ""), "",
             "| kind of process | processes | CPU seconds | share |", "|---|---|---|---|"]
    lines += [f"| {kind} | {found.processes_by_kind[kind]} | {cpu:.0f} | {cpu / total:.0%} |"
              for kind, cpu in found.cpu_by_kind.most_common()]
    lines += ["", "| test file (the processes its tests started) | CPU seconds |", "|---|---|"]
    listed = found.cpu_by_test_file.most_common(top)
    lines += [f"| `{name}` | {cpu:.0f} |" for name, cpu in listed]
    rest = sum(found.cpu_by_test_file.values()) - sum(cpu for _, cpu in listed)
    if rest > 0:
        lines.append(f"| {len(found.cpu_by_test_file) - len(listed)} others | {rest:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="what", required=True)
    recording = commands.add_parser("record", help="run a command, recording its processes' CPU")
    recording.add_argument("log", type=Path)
    recording.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    recording.add_argument("command", nargs=argparse.REMAINDER, help="-- the command")
    summarising = commands.add_parser("summary", help="the tables of a recorded log")
    summarising.add_argument("log", type=Path)
    summarising.add_argument("--top", type=int, default=15, help="how many test files to list (default 15)")
    args = parser.parse_args()
    if args.what == "summary":
        print(summary(args.log.read_text(errors="replace"), args.top))
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("record: give the command after --")
    sys.exit(record(args.log, command, args.interval))


if __name__ == "__main__":
    main()
