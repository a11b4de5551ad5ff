"""Stop signals (issue 53): SIGTERM or SIGINT sent to a flow command's process group (Ctrl-C,
`timeout`, a killed job) ends it within seconds, the tiny preset's build included: the flow
records its final state while the temporary Prefect server still runs, then the server stops;
no temporaries and no half-built model are left, and the command says it was stopped in one
line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import process_ended
from test_faults import _servers_of

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_tiny_preset_s_build_within_seconds(tmp_path, signum):
    home, artifacts, err = tmp_path / "home", tmp_path / "artifacts", tmp_path / "stderr"
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(err, "w") as out:
        # its own process group, as a shell's job: the signal goes to the whole group
        flow = subprocess.Popen([sys.executable, "-m", "flows", "prepare_model", f"paths.artifacts={artifacts}",
                                 f"paths.results={tmp_path}/results"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "preparing " not in err.read_text() and time.monotonic() < deadline:  # the build task started
            assert flow.poll() is None, err.read_text()
            time.sleep(0.2)
        time.sleep(4)  # into the build: corpus, tokenizer, model, behaviour cloning
        assert flow.poll() is None, "the build ended before it could be stopped"
        servers = _servers_of(flow.pid, home)
        assert len(servers) == 1
        assert not (artifacts / "models" / "tiny-kuhn_poker").exists()
        started = time.monotonic()
        os.killpg(flow.pid, signum)
        flow.wait(60)
        seconds = time.monotonic() - started
        print(f"{signum.name}: ended {seconds:.1f} s after the signal")
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
            flow.wait(30)
    text = err.read_text()
    assert seconds < 10, f"{seconds:.1f} s to stop\n{text}"
    assert flow.returncode == 128 + signum, text
    assert text.splitlines()[-1] == f"stopped by {signum.name}", text
    # the flow's final state recorded while its server ran, then the server stopped
    assert "Flow run" in text and "Finished in state Crashed(" in text, text
    assert "Traceback" not in text and "Error logging to API" not in text, text
    assert all(process_ended(server) for server in servers)
    models = artifacts / "models"
    left = sorted(path.name for path in models.iterdir()) if models.exists() else []
    assert left == [], f"left under {models}: {left}"  # no temporary, no half-built model
