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
from conftest import prefect_home, process_ended
from test_faults import _servers_of

from flows.__main__ import STOP_GRACE_SECONDS

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_a_stop_signal_ends_the_tiny_preset_s_build_within_seconds(tmp_path, migrated_prefect_db):
    """Ctrl-C (SIGINT) during a build. One signal is enough here: both go through one handler
    (flows/__main__.py), and the pipeline's cases below send each of them."""
    signum = signal.SIGINT
    home, artifacts, err = tmp_path / "home", tmp_path / "artifacts", tmp_path / "stderr"
    prefect_home(home, migrated_prefect_db)
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
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
            flow.wait(30)
    assert_stopped_cleanly(signum, seconds, flow.returncode, err.read_text(), servers)
    models = artifacts / "models"
    left = sorted(path.name for path in models.iterdir()) if models.exists() else []
    assert left == [], f"left under {models}: {left}"  # no temporary, no half-built model


def assert_stopped_cleanly(signum: signal.Signals, seconds: float, returncode: int, text: str, servers: list) -> None:
    """The orderly stop, not the watchdog's exit after ``STOP_GRACE_SECONDS``: status 128 +
    signal and one last line; the flow's final state recorded while its server ran, then the
    server stopped; no traceback, no failed log shipping.

    How many seconds it takes is not asserted beyond the watchdog: a former limit of 10 s failed
    in CI at ab00b8c, where one case took 10.6 s beside the other test worker on a busy 2-core
    machine, and a timed assertion fails on the machine, not on a defect. The watchdog's exit
    prints no last line, so a stop that hangs still fails here."""
    print(f"{signum.name}: ended {seconds:.1f} s after the signal")
    assert seconds < STOP_GRACE_SECONDS, f"{seconds:.1f} s to stop\n{text}"
    assert returncode == 128 + signum, text
    assert text.splitlines()[-1] == f"stopped by {signum.name}", text
    assert "Flow run" in text and "Finished in state Crashed(" in text, text
    assert "Traceback" not in text and "Error logging to API" not in text, text
    assert all(process_ended(server) for server in servers)


#: Where a signal lands in the pipeline (tests/flow_marking_a_step.py marks the call): a rollout
#: shard on a task runner's thread, where no signal handler runs (each of its model calls slowed
#: by a second, so that it is still playing), and the update, an evaluation and the report on
#: the main thread (held there, so that the signal finds them running). Score and checkpoint
#: run on the main thread as the update does.
DURING = [
    ("rollout", "mage.backends.hf:HFBackend.generate", 1.0, signal.SIGTERM),
    ("update", "mage.run.steps:update", 120.0, signal.SIGINT),
    ("evaluate", "mage.run.steps:evaluate", 120.0, signal.SIGTERM),
    ("report", "mage.run.evaluation:build_report", 120.0, signal.SIGINT),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("task", "target", "seconds", "signum"), DURING, ids=[case[0] for case in DURING])
def test_a_stop_signal_ends_the_pipeline_within_seconds_in_each_task(tiny_model_dir, tmp_path, task, target, seconds,
                                                                     signum, migrated_prefect_db):
    """The pipeline, stopped by a signal to its process group while ``task`` runs: it ends as
    the build's test says, makes no more than the model call in flight (the rollout shard on its
    thread stops before its next step), and leaves no temporary file and no run lock held."""
    home, artifacts, err, marker = tmp_path / "home", tmp_path / "artifacts", tmp_path / "stderr", tmp_path / "marked"
    prefect_home(home, migrated_prefect_db)
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    overrides = [f"model.path={tiny_model_dir}", "model.build=null", "train.iterations=1", "engine.groups=2",
                 "engine.group_size=2", "engine.episodes=2", "engine.sampling.max_new_tokens=6",
                 "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6", "paths.live=null",
                 f"paths.artifacts={artifacts}", f"paths.results={tmp_path}/results"]
    command = [sys.executable, str(REPO / "tests" / "flow_marking_a_step.py"), target, str(marker), str(seconds),
               "pipeline", *overrides]
    with open(err, "w") as out:
        flow = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=out,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            assert flow.poll() is None, err.read_text()
            time.sleep(0.05)
        assert marker.exists(), f"{task} never started\n{err.read_text()}"
        servers = _servers_of(flow.pid, home)
        started = time.monotonic()
        os.killpg(flow.pid, signum)
        calls_at_the_signal = len(marker.read_text().splitlines())
        flow.wait(60)
        seconds_to_stop = time.monotonic() - started
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
            flow.wait(30)
    text = err.read_text()
    assert_stopped_cleanly(signum, seconds_to_stop, flow.returncode, text, servers)
    # the work stopped where it was: no more than the call in flight when the signal came
    assert len(marker.read_text().splitlines()) - calls_at_the_signal <= 1, marker.read_text()
    temporaries = [str(p.relative_to(artifacts)) for p in artifacts.rglob(".*") if not p.name.endswith(".lock")]
    assert temporaries == [], temporaries
    from mage import io
    from mage.run import RunLayout
    from mage.settings import load_settings

    with io.exclusive_lock(RunLayout.of(load_settings(overrides)).lock, "the stopped run"):
        pass  # free: the stopped command held it, and the kernel released it with the process


def test_a_rollout_asked_to_stop_ends_at_its_next_step_and_the_ask_clears():
    """mage.stopping: a rollout (on any thread) asked to stop raises StopRequested before its
    next model call, which is not retried; once cleared, the same rollout plays to its end."""
    from conftest import defaults, rollout_config, sampling

    from mage import stopping
    from mage.backends.scripted import ScriptedBackend
    from mage.rollout import RolloutEngine, plan_meta_episodes
    from tasks.caching import is_transient

    settings = defaults()
    specs = plan_meta_episodes(list(settings.population.train.values()), num_groups=2, group_size=2, seed=0)
    backend = ScriptedBackend("random", seed=0)
    calls = []
    generate = backend.generate
    backend.generate = lambda *a, **k: calls.append(1) or generate(*a, **k)
    engine = RolloutEngine(backend, rollout_config(group_size=2), settings.game.params)
    stopping.request()
    try:
        with pytest.raises(stopping.StopRequested) as stopped:
            engine.run(specs, sampling(), progress=False)
    finally:
        stopping.clear()
    assert calls == [] and not is_transient(stopped.value)
    assert engine.run(specs, sampling(), progress=False)["meta_id"].n_unique() == len(specs) and calls
