"""The library works from a notebook: importing any part of ``mage`` loads neither Prefect nor
Ray (the orchestration lives in ``tasks/`` and ``flows/``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import importlib, pkgutil, sys
import mage
names = [m.name for m in pkgutil.walk_packages(mage.__path__, "mage.")]
for name in names:
    importlib.import_module(name)
print(len(names))
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in {"prefect", "prefect_ray", "ray"})))
"""


def test_importing_every_mage_module_loads_neither_prefect_nor_ray():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    count, loaded = (done.stdout.splitlines() + [""])[:2]
    modules = sorted(p for p in (REPO / "mage").rglob("*.py") if p.name != "__init__.py")
    assert int(count) >= len(modules)  # every module was imported, not a few
    assert loaded == "", f"importing mage loaded {loaded}"
