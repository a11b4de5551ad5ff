"""``python tests/flow_marking_a_step.py TARGET MARKER SECONDS FLOW [ARGS ...]``: the command
line ``python -m flows FLOW [ARGS ...]``, run as it is, except that the function TARGET
(``module:name`` or ``module:Class.name``) adds a line to the file MARKER each time it is
called, then waits SECONDS before it does its own work. A test that sees MARKER knows which
task is running, and sends its stop signal there; the lines count the calls that followed
(tests/test_stop_signals.py)."""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
import time
from pathlib import Path


def mark(target: str, marker: Path, seconds: float) -> None:
    module_name, _, attribute = target.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    @functools.wraps(original)
    def marked(*args, **kwargs):
        with marker.open("a") as lines:
            lines.write("called\n")
        time.sleep(seconds)
        return original(*args, **kwargs)

    setattr(owner, name, marked)


if __name__ == "__main__":
    target, marker, seconds, *command = sys.argv[1:]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    mark(target, Path(marker), float(seconds))
    sys.argv = ["flows", *command]
    runpy.run_module("flows", run_name="__main__", alter_sys=True)
