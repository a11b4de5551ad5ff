"""Faults (issue 18): damaged files are named in one line (an unreadable final.json is warned
about, the latest checkpoint standing in), a killed writer leaves nothing behind, and a run
has one writer."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import process_ended
from hypothesis import given, settings
from hypothesis import strategies as st

# Prefect's console handler binds the stderr of the moment it is first imported: imported inside a
# test under capsys (cli.main imports it), a later test's log line meets that closed stream
# (tests/test_config_validation.py says the same). Imported here, at collection.
import flows.common  # noqa: F401
from mage import io
from mage.models import checkpoint as ckpt
from mage.run import RunLayout, train
from mage.run.state import start_training
from mage.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent


def tiny_run(tiny_model_dir, tmp_path, *extra: str) -> Settings:
    return load_settings([
        f"model.path={tiny_model_dir}", "model.build=null", "train.iterations=2", "train.mini_batch_size=8",
        "engine.groups=2", "engine.group_size=2", "engine.episodes=2", "engine.sampling.max_new_tokens=6",
        f"paths.artifacts={tmp_path}", f"paths.results={tmp_path}/results", *extra,
    ])


# -- damaged files: one line naming the file and what to do ---------------------------------
def test_garbled_json_names_the_file_and_the_remedy(tmp_path):
    path = tmp_path / "final.json"
    path.write_text('{"checkpoint": \n garbage')
    with pytest.raises(io.CorruptFileError) as error:
        io.read_json(path)
    message = str(error.value)
    assert message.startswith(f"{path}: not valid JSON (") and "re-run" in message and "\n" not in message


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.text(), JSON_VALUES, max_size=4), max_size=5), st.data())
def test_json_lines_read_back_what_was_written_and_name_a_bad_line(tmp_path_factory, records, data):
    path = tmp_path_factory.mktemp("lines") / "metrics.jsonl"
    assert io.read_json_lines(path) == []  # no file yet: no records
    lines = [json.dumps(r) for r in records]
    blanks = data.draw(st.lists(st.integers(0, len(lines)), max_size=2))
    for at in sorted(blanks, reverse=True):
        lines.insert(at, "  ")
    path.write_text("\n".join(lines) + "\n")
    assert io.read_json_lines(path) == records
    bad = data.draw(st.sampled_from(['{"iteration": 3', "[1, 2]", "nan?"]))
    at = data.draw(st.integers(0, len(lines)))
    path.write_text("\n".join([*lines[:at], bad, *lines[at:]]) + "\n")
    with pytest.raises(io.CorruptFileError) as error:
        io.read_json_lines(path)
    assert str(error.value).startswith(f"{path}: line {at + 1} is not "), error.value


@pytest.mark.e2e
def test_a_damaged_checkpoint_is_skipped_by_resume_and_named_when_loaded(tiny_model_dir, tmp_path, caplog):
    settings = tiny_run(tiny_model_dir, tmp_path)
    train(settings, progress=False)
    root = RunLayout.of(settings).checkpoints
    first, second = ckpt.list_checkpoints(root)
    (second.path / "model.safetensors").write_bytes(b"\x00garbage, not safetensors" * 10)
    # resume takes the newest complete checkpoint, saying which one it skipped and why
    assert ckpt.latest_checkpoint(root).path == first.path
    assert any(str(second.path) in r.message and "do not match its manifest" in r.message for r in caplog.records)
    # loading it anyway (an explicit path) is one line naming the file
    state = start_training(settings)
    with pytest.raises(io.CorruptFileError, match=rf"^{second.path}/model.safetensors: does not match the "
                                                  r"checkpoint's manifest"):
        ckpt.load_weights(state.policy, second)
    # evaluating it, by name or as the run's final checkpoint, is the same one line (no stand-in)
    from mage.run.evaluation import Policy, final_policy

    io.write_json(RunLayout.of(settings).root / "final.json", {"checkpoint": str(second.path)})
    for reference in (lambda: Policy.at(second.path), lambda: final_policy(settings)):
        with pytest.raises(io.CorruptFileError, match=rf"^{second.path}/model.safetensors: does not match the "
                                                      r"checkpoint's manifest; delete this checkpoint directory"):
            reference()
    # a garbled manifest is skipped too, and named
    (first.path / ckpt.MANIFEST).write_text("{not json")
    assert ckpt.latest_checkpoint(root) is None
    with pytest.raises(io.CorruptFileError, match=rf"^{first.path}/manifest.json: not valid JSON"):
        ckpt.Checkpoint.at(first.path)


# -- kills leave nothing behind -----------------------------------------------------------
@pytest.mark.e2e
def test_temporaries_of_a_killed_write_are_removed_at_the_next_start(tiny_model_dir, tmp_path, caplog):
    settings = tiny_run(tiny_model_dir, tmp_path, "train.iterations=1")
    paths = RunLayout.of(settings)
    debris = [paths.checkpoints / ".ckpt-00002.k3j_x9az", paths.checkpoints / ".ckpt-00001.old",
              paths.root / ".metrics.jsonl.ab12cd34.tmp"]
    for path in debris[:2]:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"x" * 1000)
    debris[2].write_text("half")
    keep = paths.root / ".keep"  # a hidden file that is not ours stays
    keep.write_text("")
    train(settings, progress=False)
    assert not any(p.exists() for p in debris) and keep.exists()
    assert {str(p) for p in debris} <= {r.message.split(": ")[0].removeprefix("removed ") for r in caplog.records}
    assert [c.iteration for c in ckpt.list_checkpoints(paths.checkpoints)] == [1]


@pytest.mark.e2e
def test_a_checkpoint_is_replaced_whole(tiny_model_dir, tmp_path, monkeypatch):
    settings = tiny_run(tiny_model_dir, tmp_path, "train.iterations=1")
    train(settings, progress=False)
    root = RunLayout.of(settings).checkpoints
    (old,) = ckpt.list_checkpoints(root)
    state = start_training(settings)
    # killed between moving the old one aside and moving the new one in: the old one survives
    # as a hidden .old directory (cleared at the next start), never a half-deleted ckpt-00001
    real_rename, calls = io.os.rename, []

    def rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real_rename(src, dst)

    monkeypatch.setattr(io.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(root, 1, state.policy, state.trainer.optimizer, config_hash="x", parent=None,
                             metrics={})
    assert calls[0] == ("ckpt-00001", ".ckpt-00001.old")
    assert not (root / "ckpt-00001").exists() and (root / ".ckpt-00001.old" / ckpt.MANIFEST).is_file()
    assert [p.name for p in root.iterdir() if p.name.startswith(".ckpt-00001.") and p.name != ".ckpt-00001.old"] == []
    monkeypatch.setattr(io.os, "rename", real_rename)
    new = ckpt.save_checkpoint(root, 1, state.policy, state.trainer.optimizer, config_hash="y", parent=None,
                               metrics={})
    assert ckpt.is_complete(new.path) and new.manifest["config_hash"] == "y" and old.manifest["config_hash"] != "y"
    assert sorted(p.name for p in root.iterdir()) == [".ckpt-00001.old", "ckpt-00001"]  # until the next start
    assert io.remove_stale_temporaries(root) == [root / ".ckpt-00001.old"]


# -- one run name, one writer ---------------------------------------------------------------
def _hold(lock: str, ready, release) -> None:
    with io.exclusive_lock(lock, "run 'x'"):
        ready.set()
        release.wait(30)


def test_a_second_writer_of_a_run_stops_with_the_holder_named(tmp_path):
    lock = tmp_path / ".x.lock"
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(lock), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(io.RunLockedError, match=rf"run 'x' is in use by pid {holder.pid} \(lock {lock}\)"):
            with io.exclusive_lock(lock, "run 'x'"):
                pass
    finally:
        release.set()
        holder.join(30)
    with io.exclusive_lock(lock, "run 'x'"):  # released with its holder
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    lock = tmp_path / ".x.lock"
    code = (f"from mage import io\nimport os, time\nwith io.exclusive_lock({str(lock)!r}, 'run'):\n"
            f"    print('held', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(io.RunLockedError):
            with io.exclusive_lock(lock, "run"):
                pass
    finally:
        process.kill()
        process.wait(30)
    with io.exclusive_lock(lock, "run"):
        assert lock.read_text().strip().startswith("pid ")


def test_the_command_line_prints_one_line_for_a_run_in_use(tmp_path, monkeypatch, capsys):
    import flows
    import flows.__main__ as cli

    def busy(**_):
        raise io.RunLockedError("run 'x' is in use by pid 1 (lock /tmp/.x.lock); wait for it to finish")

    monkeypatch.setattr(flows, "load", lambda name: busy)
    assert cli.main(["train"]) == 2
    assert capsys.readouterr().err == "error: run 'x' is in use by pid 1 (lock /tmp/.x.lock); wait for it to finish\n"
    with pytest.raises(io.RunLockedError):
        cli.main(["train", "--debug"])


@pytest.mark.e2e
def test_a_flow_process_ends_when_its_parent_is_killed(tmp_path):
    # `dvc repro` runs a stage as a child process; killed, it must not leave the stage running
    child = ("import time, flows.__main__ as m\nm.die_with_parent()\nprint('ready', flush=True)\n"
             "try:\n    time.sleep(60)\nexcept SystemExit:\n    open('exited', 'w').write('yes')\n    raise\n")
    parent = ("import subprocess, sys\n"
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], cwd={str(tmp_path)!r})\n"
              "print(p.pid, flush=True)\np.wait()\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, env=env)
    child_pid = int(process.stdout.readline())
    import time

    deadline = time.time() + 60
    while not (tmp_path / "exited").exists() and time.time() < deadline:
        time.sleep(0.2)
        if time.time() > deadline - 55 and process.poll() is None:
            process.kill()  # SIGKILL: the parent gets no chance to pass anything on
    process.wait(30)
    assert (tmp_path / "exited").read_text() == "yes"
    time.sleep(0.5)
    status = Path(f"/proc/{child_pid}/status")  # gone, or a zombie no one has reaped yet
    assert not status.exists() or "\nState:\tZ" in status.read_text()


# -- server faults fail clearly, within flow.api_timeout_seconds ----------------------------
@pytest.mark.e2e
def test_a_prefect_api_that_hangs_or_is_down_fails_in_bounded_time(tmp_path):
    # The command a user runs, in its own process: in this one, the session's Prefect test
    # harness (once a flow test has started it) overrides PREFECT_API_URL with its own server.
    import os
    import socket
    import time

    def command(api_url: str, *overrides: str) -> subprocess.CompletedProcess:
        env = os.environ | {"PREFECT_API_URL": api_url, "PREFECT_HOME": str(tmp_path / "home"),
                            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "NO_PROXY": "127.0.0.1,localhost"}
        for key in ("PREFECT_API_REQUEST_TIMEOUT", "PYTHONWARNINGS", "PYTHONDEVMODE"):
            env.pop(key, None)
        return subprocess.run([sys.executable, "-m", "flows", "train", f"paths.artifacts={tmp_path}/artifacts",
                               f"paths.results={tmp_path}/results", *overrides],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections, never answers
    try:
        started = time.monotonic()
        result = command(f"http://127.0.0.1:{hung.getsockname()[1]}/api", "flow.api_timeout_seconds=1.5")
        assert time.monotonic() - started < 60  # the interpreter's start and imports, then 1.5 s
    finally:
        hung.close()
    # one line, and no flow ran: only the API check writes this message
    assert result.returncode == 2 and result.stdout == ""
    assert "did not answer within 1.5 s (flow.api_timeout_seconds)" in result.stderr
    assert result.stderr.count("\n") == 1
    down = socket.socket()
    down.bind(("127.0.0.1", 0))
    port = down.getsockname()[1]
    down.close()  # nothing listens there
    result = command(f"http://127.0.0.1:{port}/api")
    assert result.returncode == 2 and "cannot be reached" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "artifacts").exists()  # nothing was started


# -- the temporary Prefect server lives and dies with its command ---------------------------
def _servers_of(pid: int, home: Path) -> list:
    """The ``prefect server start`` processes under ``pid`` with their database in ``home``."""
    import psutil

    found = []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            if "server" in process.cmdline() and process.environ().get("PREFECT_HOME") == str(home):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.e2e
def test_the_temporary_server_ends_with_a_flow_killed_by_sigkill(tmp_path):
    import os
    import signal
    import time

    home = tmp_path / "home"
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    flow = subprocess.Popen([sys.executable, "-m", "flows", "seed_population", f"paths.artifacts={tmp_path}/artifacts",
                             f"paths.results={tmp_path}/results"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (servers := _servers_of(flow.pid, home)) and time.monotonic() < deadline:
            assert flow.poll() is None, "the flow ended before its server started"
            time.sleep(0.1)
        (server,) = servers
        assert server.cmdline()[-4:-2] == ["--host", "127.0.0.1"]  # never beyond this machine
    finally:
        os.kill(flow.pid, signal.SIGKILL)  # no handler runs, no atexit
        flow.wait(30)
    deadline = time.monotonic() + 60
    while not process_ended(server) and time.monotonic() < deadline:  # PR_SET_PDEATHSIG: the kernel signals it
        time.sleep(0.1)
    if not process_ended(server):
        server.kill()
        pytest.fail("the temporary Prefect server outlived its flow")


@pytest.mark.e2e
def test_first_starts_sharing_a_prefect_home_wait_for_each_other(tmp_path):
    # two servers migrating one new database at once fail with "no such table": the second
    # start waits for the first one's lock
    import os
    import threading
    import time

    import httpx

    from flows.server import temporary_server

    home = tmp_path / "home"
    started: list[str] = []
    failures: list[BaseException] = []
    release = threading.Event()

    def start():
        try:
            with temporary_server(home, startup_timeout=120) as url:
                assert httpx.get(f"{url}/health", timeout=10).json() is True
                started.append(url)
                release.wait(60)
        except BaseException as error:  # noqa: BLE001 (re-raised in the test's thread)
            failures.append(error)

    starter = threading.Thread(target=start)
    try:
        with io.exclusive_lock(home / ".temporary-server.lock", "the Prefect home"):
            starter.start()
            time.sleep(2)
            assert not started and not _servers_of(os.getpid(), home)  # waiting, nothing started
        deadline = time.monotonic() + 120
        while not started and starter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started and started[0].startswith("http://127.0.0.1:"), failures
    finally:
        release.set()
        starter.join(60)
    assert not failures, failures
    assert not _servers_of(os.getpid(), home) and not list(home.glob("temporary-server-*.log"))  # stopped, log gone


def test_prefect_s_log_of_a_user_error_keeps_its_line_and_drops_the_traceback():
    import logging

    import flows.__main__ as cli

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger, keep = logging.getLogger("prefect.flow_runs"), Keep()
    logger.addHandler(keep)
    try:
        cli.quiet_tracebacks_of((io.RunLockedError,))
        cli.quiet_tracebacks_of((io.RunLockedError,))  # main may run more than once in a process
        for error in (io.RunLockedError("run 'x' is in use by pid 1"), ValueError("a bug")):
            try:
                raise error
            except Exception:
                logger.exception("Encountered exception during execution")
    finally:
        logger.removeHandler(keep)
        logger.filters.clear()
    assert [r.exc_info is None for r in seen] == [True, False]  # a bug keeps its traceback
    assert len([f for f in logging.getLogger("prefect.task_runs").filters if type(f).__name__ == "OneLine"]) == 1
    logging.getLogger("prefect.task_runs").filters.clear()


# -- a final.json that cannot be followed: warned about, the latest checkpoint stands in ---
def test_an_unreadable_or_stale_final_json_is_named_and_the_latest_checkpoint_stands_in(tiny_model_dir, tmp_path,
                                                                                        caplog):
    from conftest import algo_config, train_config

    from mage.models.policy import load_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    layout = RunLayout(tmp_path / "run")
    policy = load_policy(tiny_model_dir)
    optimizer = PolicyTrainer(policy, train_config(), algo_config()).optimizer
    first, second = (ckpt.save_checkpoint(layout.checkpoints, i, policy, optimizer, config_hash="h", parent=None,
                                          metrics={}) for i in (1, 2))
    layout.write_final(first, iterations=1)
    assert layout.final_checkpoint() == first.path  # the one final.json names, not the newest
    for text, said in (('{"checkpoint": "checkpoints/ckpt-000', "unreadable"), ("[1, 2]", "unreadable"),
                       ('{"iterations": 1}', "unreadable"),
                       ('{"checkpoint": "checkpoints/ckpt-00007"}', "its checkpoint checkpoints/ckpt-00007 is gone")):
        layout.final.write_text(text)
        caplog.clear()
        assert layout.final_checkpoint() == second.path, text
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and warnings[0].startswith(f"{layout.final}: {said}"), (text, warnings)
        assert "using the run's latest complete checkpoint instead" in warnings[0]

