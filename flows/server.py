"""The Prefect API a command-line flow reports to.

With ``PREFECT_API_URL`` set, that server must answer ``/health`` within
``flow.api_timeout_seconds``. Without one, Prefect would start a temporary server as a child
process that outlives a flow killed with SIGKILL (or a killed ``dvc repro``). So the command
starts that server itself: ``prefect server start`` on 127.0.0.1 and a free port, tied to this
process by ``PR_SET_PDEATHSIG`` (Linux), and stopped when the command ends, however it ends.
It runs in a session of its own, so a stop signal sent to the command's process group reaches
the flow only: the flow ends and records its state, then the server is stopped.

First starts that share a Prefect home are serialised by a lock: two servers migrating one
new database at once fail with ``sqlite3.OperationalError: no such table``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mage import io


class PrefectAPIError(RuntimeError):
    """The Prefect API cannot be reached, does not answer, or could not be started."""


def check_prefect_api(url: str, timeout: float) -> None:
    """Raise :class:`PrefectAPIError` unless ``url`` answers ``/health`` within ``timeout`` s."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).raise_for_status()
    except httpx.TimeoutException:
        raise PrefectAPIError(
            f"the Prefect API at {url} did not answer within {timeout:g} s (flow.api_timeout_seconds); "
            "check the server, or unset PREFECT_API_URL to use a temporary one") from None
    except httpx.HTTPError as error:
        raise PrefectAPIError(f"the Prefect API at {url} cannot be reached ({error}); start it, or unset "
                              "PREFECT_API_URL to use a temporary one") from None


def _pdeathsig_setter():
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)`` for the calling process, looked up now (None off
    Linux). The signal comes when the *thread* that started the process exits; here that is
    always the main one."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def end_with_parent() -> None:
    """SIGTERM this process when its parent dies (Linux)."""
    setter = _pdeathsig_setter()
    if setter is not None:
        setter()


def _ends_with_this_process():
    """A ``preexec_fn`` that ties a child to this process. Everything is looked up before the
    fork: between fork and exec the child only calls prctl (no import, no dlopen)."""
    setter, this = _pdeathsig_setter(), os.getpid()

    def in_child() -> None:
        if setter is not None:
            setter()
        if os.getppid() != this:  # this process died before prctl: no signal would come
            os._exit(1)

    return in_child


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def temporary_server(home: Path, startup_timeout: float) -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1 with its database under ``home``, for as long as
    the context (and this process) lives; yields its API URL."""
    home.mkdir(parents=True, exist_ok=True)
    env = os.environ | {
        "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
        # a server that lives for one command schedules nothing
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false", "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    with io.exclusive_lock(home / ".temporary-server.lock", "the Prefect home", wait=True):
        _remove_logs_of_dead_commands(home)
        port = _free_port()
        url = f"http://127.0.0.1:{port}/api"
        log = home / f"temporary-server-{os.getpid()}.log"  # named by its command: a killed one's is removed later
        with open(log, "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                # its own session: a signal sent to this command's process group (Ctrl-C, `timeout`,
                # a killed job) stops the flow, which records its final state, and only then the server
                start_new_session=True,
                preexec_fn=_ends_with_this_process())  # noqa: PLW1509 (the child calls prctl only)
        try:
            _wait_until_healthy(url, process, startup_timeout, log)
        except BaseException:
            _stop(process)
            raise
    try:
        yield url
    finally:
        _stop(process)
        log.unlink(missing_ok=True)


def _remove_logs_of_dead_commands(home: Path) -> None:
    for log in home.glob("temporary-server-*.log"):
        pid = log.stem.removeprefix("temporary-server-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and sys.platform.startswith("linux"):
            log.unlink(missing_ok=True)


def _wait_until_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:].strip()
            raise PrefectAPIError(f"the temporary Prefect server exited with status {process.returncode} "
                                  f"(log {log}): {tail.splitlines()[-1] if tail else 'no output'}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200 and process.poll() is None:
                return  # ours answered (not another server that took the port first)
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise PrefectAPIError(f"the temporary Prefect server did not start within {timeout:g} s (log {log}); raise "
                          "flow.server_start_timeout_seconds on a busy machine, or start a server and set "
                          "PREFECT_API_URL")


@contextmanager
def prefect_api(request_timeout: float, start_timeout: float) -> Iterator[str]:
    """The API this command's flows report to: the configured one (``PREFECT_API_URL``, from
    the environment or a Prefect profile) once it answers, or a temporary server of this
    process's own that must start within ``start_timeout`` seconds. Every request gets
    ``request_timeout`` seconds. The environment is restored afterwards."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    saved = {key: os.environ.get(key) for key in ("PREFECT_API_URL", "PREFECT_API_REQUEST_TIMEOUT")}
    os.environ["PREFECT_API_REQUEST_TIMEOUT"] = str(request_timeout)
    refresh_global_settings_context()
    try:
        settings = get_current_settings()
        if settings.api.url:
            check_prefect_api(settings.api.url, request_timeout)
            yield settings.api.url
            return
        with temporary_server(Path(settings.home), start_timeout) as url:
            os.environ["PREFECT_API_URL"] = url  # for Prefect's settings, and for any child process
            refresh_global_settings_context()
            try:
                yield url
            finally:
                deliver_queued_logs_and_events()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        refresh_global_settings_context()


def deliver_queued_logs_and_events(timeout: float = 10.0) -> None:
    """Send what Prefect's background workers still queue to the server before it stops
    (otherwise the last lines fail with "Error logging to API"). A failure here loses log
    lines, not work: it is a warning, and never hides the command's own error."""
    import logging

    try:
        if "prefect.logging.handlers" in sys.modules:
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=timeout)
        if "prefect.events.worker" in sys.modules:
            from prefect.events.worker import EventsWorker

            EventsWorker.drain_all(timeout=timeout)
    except Exception as error:  # noqa: BLE001
        logging.getLogger(__name__).warning(f"Prefect's last logs and events may not have reached the server: {error}")
