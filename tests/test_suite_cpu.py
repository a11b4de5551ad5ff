"""scripts/suite/suite_cpu.py: command lines sorted into kinds as read by hand, a recorded log's
sums worked out by hand, a real recording of a command with children, and any text read
without an error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "suite"))
from suite_cpu import RECORDER, file_of_current_test, kind_of, record, tally


@pytest.mark.parametrize(("command", "kind"), [
    ("/w/.venv/bin/python -m pytest -n 2 --dist loadfile", "pytest"),
    ("[pytest-xdist running] tests/test_flows.py::test_train", "pytest"),
    ("python -c import sys;exec(eval(sys.stdin.readline()))", "pytest"),
    ("/w/.venv/bin/python -m prefect server start --host 127.0.0.1 --port 4200", "Prefect server"),
    ("/w/.venv/bin/python -m flows train paths.artifacts=/tmp/pytest-of-root/x", "flow command"),
    ("ray::RolloutActor.play", "Ray worker"),
    (("/w/.venv/bin/python /w/.venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py "
      "--temp-dir=/tmp/pytest-of-root/ray"), "Ray worker"),
    ("/w/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node_id=x", "Ray daemon"),
    ("/w/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --port=1", "Ray daemon"),
    ("/w/.venv/bin/python -m dvc exp run -S train.iterations=1", "DVC"),
    ("VLLM::EngineCore", "vLLM"),
    ("VLLM::Worker", "vLLM"),
    ("/usr/lib/chromium/chromium --headless", "browser"),
    ("/bin/sh -c exec python -m flows report", "flow command"),  # a DVC stage: its command is the flow
    ("bash scripts/run.sh -S algo=grpo", "shell"),
    ("git -c user.name=test commit -qm clone", "git"),
    ("/w/.venv/bin/python -c import ray", "other Python"),
    ("sleep 5", "other"),
])
def test_each_command_line_is_sorted_into_its_kind(command, kind):
    assert kind_of(command) == kind


def test_the_test_file_is_read_from_pytest_s_current_test():
    assert file_of_current_test("tests/test_ray_runner.py::test_a[x::y] (call)") == "tests/test_ray_runner.py"
    assert file_of_current_test(None) == file_of_current_test("") == "-"


LOG = "\n".join([
    json.dumps({"pid": 1, "command": "[pytest-xdist idle]", "test": None, "cpu": 100.0}),
    json.dumps({"pid": 2, "command": "python -m flows train", "test": "tests/test_a.py::t (call)", "cpu": 12.5}),
    json.dumps({"pid": 3, "command": "ray::RolloutActor.play", "test": "tests/test_a.py::u (setup)", "cpu": 7.5}),
    json.dumps({"pid": 4, "command": "python -m flows evaluate", "test": "tests/test_b.py::v (call)", "cpu": 3.0}),
    json.dumps({"pid": 5, "command": "python -m flows report", "test": None, "cpu": 1.0}),
    '{"pid": 6, "command": "cut sh',
    json.dumps({"pid": 7, "command": RECORDER, "test": None, "cpu": 0.5, "wall": 60.0}),
])


def test_a_log_is_summed_by_kind_and_by_test_file():
    found = tally(LOG)
    assert dict(found.cpu_by_kind) == {"pytest": 100.0, "flow command": 16.5, "Ray worker": 7.5, RECORDER: 0.5}
    assert dict(found.processes_by_kind) == {"pytest": 1, "flow command": 3, "Ray worker": 1, RECORDER: 1}
    # the pytest workers' own CPU and the recorder's belong to no test file
    assert dict(found.cpu_by_test_file) == {"tests/test_a.py": 20.0, "tests/test_b.py": 3.0, "-": 1.0}
    assert found.wall == 60.0


def test_a_recording_holds_each_child_with_its_cpu_and_the_test_it_ran_under(tmp_path, monkeypatch):
    """Two children that burn a second of CPU each, then sleep a second (so that a sample sees
    their final CPU), started by a parent that reaps them only two seconds after they have
    exited: each is found under its own command line (not the empty one of a process exited and
    not yet reaped), under the PYTEST_CURRENT_TEST it inherited, with its CPU (the burning
    second, plus the interpreter's start)."""
    burner = tmp_path / "burn.py"
    burner.write_text("import time\nt = time.process_time()\nwhile time.process_time() - t < 1:\n    pass\n"
                      "time.sleep(1)\n")
    parent = tmp_path / "parent.py"
    parent.write_text("import os, subprocess, sys, time\n"
                      "children = [subprocess.Popen([sys.executable, sys.argv[1]]) for _ in range(2)]\n"
                      "# wait for both to exit without reaping them, then leave them unreaped a while\n"
                      "for child in children:\n"
                      "    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)\n"
                      "time.sleep(2)\n"
                      "sys.exit(max(child.wait() for child in children))\n")
    log = tmp_path / "cpu.jsonl"
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_y (call)")
    assert record(log, [sys.executable, str(parent), str(burner)], interval=0.1) == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    burners = [e for e in entries if e["command"] == f"{sys.executable} {burner}"]
    assert len(burners) == 2, entries
    assert all(1.0 <= e["cpu"] <= 2.0 and e["test"] == "tests/test_x.py::test_y (call)" for e in burners), burners
    assert entries[-1]["command"] == RECORDER and entries[-1]["wall"] >= 4


@given(st.text())
def test_any_text_is_read_without_an_error(text):
    found = tally(text)
    assert all(cpu >= 0 for cpu in found.cpu_by_kind.values())
