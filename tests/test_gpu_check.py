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
    assert steps["training"]["iterations"] == [1, 2, 3]
    assert [p["iteration"] for p in steps["training"]["performance"]] == [1, 2, 3]
    sweep = steps["memory_sweep"]
    assert sweep["peak_mib"]["128"] < sweep["unchunked_peak_mib"]["128"]  # four chunks of 32 against 128 tokens' logits
    full = steps["bf16_full_fine_tuning"]
    assert full["logits_chunk_tokens"] == 1024 and full["moved_share"] >= 0.9 and full["step_cosine"] > 0.99
    assert steps["update_speed"]["tokens_per_second"] > 0 and steps["update_speed"]["mfu"] is None
