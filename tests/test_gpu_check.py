"""scripts/gpu_check.sh --dry-run: the GPU check's steps at toy sizes on the CPU, so that the
command a lent GPU runs has run before, end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_the_gpu_check_dry_run_runs_every_step(tmp_path):
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path)}, timeout=900)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert done.returncode == 0, {k: v.get("error") for k, v in steps.items()}
    assert report["dry_run"] and set(steps) == {"gpu_tests", "training", "memory_sweep", "bf16_full_fine_tuning",
                                                "update_speed"}
    assert steps["gpu_tests"]["returncode"] == 0 and "skipped" in steps["gpu_tests"]["summary"]  # no GPU here
    assert steps["training"]["iterations"] == [1, 2]
    assert [p["iteration"] for p in steps["training"]["performance"]] == [1, 2]
    sweep = steps["memory_sweep"]
    assert sweep["peak_mib"]["128"] < sweep["unchunked_peak_mib"]["128"]  # four chunks of 32 against 128 tokens' logits
    full = steps["bf16_full_fine_tuning"]
    assert full["logits_chunk_tokens"] == 1024 and full["moved_share"] >= 0.9 and full["step_cosine"] > 0.99
    assert steps["update_speed"]["tokens_per_second"] > 0 and steps["update_speed"]["mfu"] is None


@pytest.mark.e2e
def test_the_gpu_site_packs_wheels_for_the_gpu_machine(tmp_path):
    """scripts/gpu_site.sh on a short list: a binary wheel for Python 3.12 and the source-only
    antlr4 runtime, unpacked into one archive the check can put on PYTHONPATH."""
    import sys
    import tarfile

    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# two of constraints/gpu-check.txt\nannotated-types==0.8.0\nantlr4-python3-runtime==4.9.3\n")
    archive = tmp_path / "site.tar.xz"
    env = {**os.environ, "MAGE_GPU_SITE_REQUIREMENTS": str(requirements), "MAGE_GPU_SITE": str(archive),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu_site.sh"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    assert {"./annotated_types/__init__.py", "./antlr4/__init__.py"} <= names
    assert any(name.startswith("./annotated_types-0.8.0.dist-info/") for name in names)


def test_the_gpu_check_pins_the_project_s_versions():
    """constraints/gpu-check.txt pins each package at the version constraints/cpu.txt installs
    here, so the GPU check runs what CI tests."""
    import re

    def pins(path: Path) -> dict[str, str]:
        found = {}
        for line in path.read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==", 1)
                found[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.split(";")[0].strip()
        return found

    gpu, cpu = pins(ROOT / "constraints" / "gpu-check.txt"), pins(ROOT / "constraints" / "cpu.txt")
    assert len(gpu) == 12 and {name: cpu.get(name) for name in gpu} == gpu


#: Top-level modules this project installs that a registry-less GPU image lacks (its torch,
#: transformers, peft and pytest stack plus constraints/gpu-check.txt is all it has).
ABSENT_ON_A_GPU_MACHINE = ("prefect", "prefect_ray", "ray", "dvc", "dvclive", "fastapi", "hypothesis", "playwright",
                           "psutil", "vllm", "tzlocal", "xdist")

BLOCKED_COLLECTION = """
import sys
class Hiding:  # each import finder, blind to the absent packages: they import and look as missing
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)
sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *{files!r}]))
"""


def test_the_gpu_tests_collect_without_what_a_gpu_machine_lacks():
    """The check's first step collects only the GPU-marked modules, and they import nothing a GPU
    machine without a registry lacks: on the first lent H100, collecting every module stopped
    pytest at four import errors before any GPU test ran."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    files = gpu_check.gpu_test_files()
    assert "tests/test_gpu_paths.py" in files and "tests/test_gpu_check.py" not in files

    script = BLOCKED_COLLECTION.format(blocked=set(ABSENT_ON_A_GPU_MACHINE), files=files)
    # the GPU image's pytest has none of this project's plugins (xdist, timeout, hypothesis's)
    bare = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=bare)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(collected) == 3, done.stdout[-2000:]

    # the blocker itself works: collecting every module fails as it did on the GPU machine
    everything = BLOCKED_COLLECTION.format(blocked=set(ABSENT_ON_A_GPU_MACHINE), files=["tests"])
    done = subprocess.run([sys.executable, "-c", everything], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=bare)
    assert done.returncode != 0 and "No module named" in done.stdout
