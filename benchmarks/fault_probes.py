"""The probes of ``benchmarks/faults.py``: run a command, kill it, and look at what is left."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
#: A task run's log line: its name without the iteration ("update-3" -> "update"), and the message.
TASK_LINE = re.compile(r"Task run '([a-z]+(?:-[a-z]+)*)[^']*' - (.*)$")
#: Kills per campaign before the run is let finish (a restart repeats start-up work, so a
#: kill at a random time might otherwise never let it end).
KILLS_PER_CAMPAIGN = 5


def environment(home: Path) -> dict[str, str]:
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # DVC stages call `python` of this environment
    return env


def run_command(command: list[str], cwd: Path, home: Path, check: bool = False, timeout: float = 1800) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=environment(home), capture_output=True, text=True, timeout=timeout,
                          check=False)
    output = done.stdout + done.stderr
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:5])} ... failed ({done.returncode}):\n{output[-4000:]}")
    errors = [line for line in output.splitlines() if line.startswith(("error:", "config error:"))]
    return {"rc": done.returncode, "output": output, "seconds": time.monotonic() - started,
            "last_error": errors[-1] if errors else ""}


def one_line_error(result: dict[str, Any], target: Path) -> bool:
    """Exit status 2, one ``error:`` line that names the file, no traceback."""
    errors = [line for line in result["output"].splitlines() if line.startswith(("error:", "config error:"))]
    return (result["rc"] == 2 and len(errors) == 1 and (str(target) in errors[0] or target.name in errors[0])
            and "Traceback" not in result["output"])


def debris(root: Path) -> list[str]:
    """Temporaries of an interrupted write under ``root`` (what the next start must remove)."""
    from mage.io import STALE_TEMPORARY

    return sorted(str(p) for p in root.rglob("*") if STALE_TEMPORARY.fullmatch(p.name)) if root.exists() else []


def weights_digest(artifacts: Path) -> str | None:
    """sha256 over the final checkpoint's tensors files (names and bytes)."""
    finals = sorted((artifacts / "runs").glob("*/final.json"))
    if not finals:
        return None
    checkpoint = finals[0].parent / json.loads(finals[0].read_text())["checkpoint"]  # relative to the run
    digest = hashlib.sha256()
    for path in sorted(checkpoint.glob("*.safetensors")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def where(log: Path) -> str:
    """What the killed command was doing: the last stage (dvc) and task that logged."""
    text = log.read_text(errors="replace") if log.exists() else ""
    stages = re.findall(r"Running stage '(\w+)'", text)
    tasks = [m.group(1) for line in text.splitlines() if (m := TASK_LINE.search(line))]
    return "/".join(filter(None, [stages[-1] if stages else "", tasks[-1] if tasks else "start-up"]))


def ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # its new parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def kill_campaign(target: str, command: list[str], cwd: Path, home: Path, artifacts: Path, duration: float,
                  rng: random.Random, kills_wanted: int = KILLS_PER_CAMPAIGN) -> dict[str, Any]:
    """Start ``command``; SIGKILL it after a random delay and restart it, ``kills_wanted``
    times at most; then let it finish. Records where each kill landed, how long the processes
    it had started took to end, what was left, and what was computed twice."""
    logs = artifacts.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    attempts: list[dict[str, Any]] = []
    landed: collections.Counter[str] = collections.Counter()
    orphans, slowest, kills = 0, 0.0, 0
    while True:
        log = logs / f"attempt-{len(attempts)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(command, cwd=cwd, env=environment(home), stdout=out, stderr=subprocess.STDOUT)
        delay = rng.uniform(1.0, duration) if kills < kills_wanted else None
        try:
            rc = process.wait(delay)
        except subprocess.TimeoutExpired:
            started = psutil.Process(process.pid).children(recursive=True)
            debris_at_kill = len(debris(artifacts))
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            killed = time.monotonic()
            while not all(ended(p) for p in started) and time.monotonic() - killed < 60:
                time.sleep(0.05)
            left = []
            for p in started:  # record, then clean up so the next attempt is not disturbed
                try:
                    if not ended(p):
                        left.append(" ".join(p.cmdline()[:6]))
                        p.kill()
                except psutil.NoSuchProcess:
                    pass
            orphans += len(left)
            slowest = max(slowest, time.monotonic() - killed)
            kills += 1
            landed[where(log)] += 1
            attempts.append({"killed_after": round(delay, 1), "where": where(log), "debris_at_kill": debris_at_kill,
                             "orphans": left})
            continue
        attempts.append({"rc": rc, "where": "finished"})
        break
    completed = collections.Counter()
    for path in sorted(logs.glob("attempt-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if (m := TASK_LINE.search(line)) and m.group(2).startswith("Finished in state Completed"):
                completed[m.group(1)] += 1
    iterations = len(list((artifacts / "runs").glob("*/checkpoints/ckpt-*")))
    return {"target": target, "kills": kills, "restarts": len(attempts) - 1, "final_rc": attempts[-1]["rc"],
            "landed": dict(landed), "computed_twice": max(0, completed["update"] - iterations),
            "rollouts_computed_twice": max(0, completed["rollout"] - iterations),
            "orphans": orphans, "debris": len(debris(artifacts)), "max_seconds_to_die": round(slowest, 1),
            "attempts": attempts}


def clone_working_tree(source: Path, target: Path) -> None:
    """Tracked and untracked-but-not-ignored files of ``source``, committed in a new git and
    DVC repository at ``target``."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=source,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=probe", "-c", "user.email=probe@example.org", "commit", "-qm", "clone"]):
        subprocess.run(command, cwd=target, check=True, capture_output=True)


def hung_and_down_servers(work: Path, small: list[str]) -> list[dict[str, Any]]:
    """``PREFECT_API_URL`` at a socket that never answers, and at a port where nothing listens."""
    records = []
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    down = socket.socket()
    down.bind(("127.0.0.1", 0))
    closed_port = down.getsockname()[1]
    down.close()
    try:
        for case, port, expected in (("server hangs (bound 5 s)", hung.getsockname()[1], "did not answer within 5 s"),
                                     ("server down", closed_port, "cannot be reached")):
            os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
            try:
                result = run_command([sys.executable, "-m", "flows", "train", *small, "flow.api_timeout_seconds=5",
                                      f"paths.artifacts={work}/server-probe", f"paths.results={work}/server-probe/results"],
                                     REPO, work / "server-home")
            finally:
                del os.environ["PREFECT_API_URL"]
            errors = [line for line in result["output"].splitlines() if line.startswith("error:")]
            records.append({"case": case, "rc": result["rc"], "seconds": round(result["seconds"], 1),
                            "as_designed": result["rc"] == 2 and len(errors) == 1 and expected in errors[0]
                            and "Traceback" not in result["output"], "message": result["last_error"]})
    finally:
        hung.close()
    return records


def concurrent_first_starts(work: Path, trials: int) -> list[dict[str, Any]]:
    """Two commands at once on a new Prefect home (each starts its temporary server)."""
    records = []
    for trial in range(trials):
        home = work / f"shared-home-{trial}"
        started = time.monotonic()
        processes = [subprocess.Popen([sys.executable, "-m", "flows", "seed_population",
                                       f"paths.artifacts={work}/shared-{trial}-{i}",
                                       f"paths.results={work}/shared-{trial}-{i}/results"], cwd=REPO, env=environment(home),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        try:
            outputs = [p.communicate(timeout=600)[0] for p in processes]
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
        bad = [line for o in outputs for line in o.splitlines() if "no such table" in line or "Traceback" in line]
        records.append({"case": f"two first starts on one new Prefect home ({trial + 1})",
                        "rc": ",".join(str(p.returncode) for p in processes), "seconds": round(time.monotonic() - started, 1),
                        "as_designed": all(p.returncode == 0 for p in processes) and not bad,
                        "message": bad[0] if bad else ""})
    return records


def second_writer(work: Path, small: list[str]) -> dict[str, Any]:
    """A second run with the same run name while the first one trains."""
    artifacts = work / "two-writers"
    # long enough that the second command reaches the lock while the first still trains
    command = [sys.executable, "-m", "flows", "train", *small, "train.iterations=40", f"model.path={work / 'model'}",
               f"paths.artifacts={artifacts}", f"paths.results={artifacts}/results"]
    first = subprocess.Popen(command, cwd=REPO, env=environment(work / "two-writers-home"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and first.poll() is None:
            locks = list((artifacts / "runs").glob(".*.lock")) if (artifacts / "runs").exists() else []
            if locks and locks[0].read_text().strip() == f"pid {first.pid}":
                break  # the first run holds it (the holder writes its pid once it has the lock)
            time.sleep(0.2)
        result = run_command(command, REPO, work / "two-writers-home-2")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(120)
    return {"case": "second writer of a run", "rc": result["rc"], "seconds": round(result["seconds"], 1),
            "as_designed": result["rc"] == 2 and "is in use by pid" in result["last_error"]
            and "Traceback" not in result["output"], "message": result["last_error"]}
