"""Test-wide settings: offline, quiet, no telemetry."""

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Prefect keeps its database, results and cache records under PREFECT_HOME: a fresh one per
# test session, so tests never read a developer's (or an earlier session's) cache.
_prefect_home = tempfile.mkdtemp(prefix="mage-test-prefect-")
atexit.register(shutil.rmtree, _prefect_home, True)
os.environ["PREFECT_HOME"] = _prefect_home
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process (torch reads this on import; the processes tests start, Ray's
# workers, DVC's stages and Prefect's, inherit it): the suite runs two pytest workers on two
# cores, each starting more processes, and OpenMP's threads spin while they wait for one
# another, so two threads a process on a shared core made the CPU-bound tests about three times
# slower (BENCHMARKS.md, "The test suite": scripts/suite/test_threads.sh). The tests' models are tiny: a second thread bought them nothing.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402  (the environment above must be set before any import)


# -- settings for tests that build one section by hand ------------------------------------
# Sections have no defaults (params/ holds them): a test that needs one section builds it
# here, with the method's values (docs/method.md) or params/'s, and changes what it tests.
def sampling(**changes):
    """Plain sampling: temperature 1, no top-p or top-k filter, 256 new tokens, phase stops."""
    from mage.config.sections import SamplingSection

    return SamplingSection(**({"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 256, "stop": None,
                                "seed": None} | changes))


def rollout_config(**changes):
    """The method's meta-episodes: 3 episodes, groups of 8, early stop, reflections only, the same
    initial state, prompts of up to 4096 tokens (oldest episodes dropped beyond), all at once."""
    from mage.config.sections import RolloutSection

    return RolloutSection(**({"episodes": 3, "group_size": 8, "early_stop": True, "context_mode": "reflection_only",
                             "same_initial_state": True, "max_prompt_tokens": 4096, "prompt_overflow": "drop_oldest",
                             "concurrency": None} | changes))


@functools.cache
def defaults(*overrides: str):
    """The settings params/ composes (with ``overrides``), validated."""
    from mage.settings import load_settings

    return load_settings(list(overrides))


def algo_config(**changes):
    """params/algo/mage.yaml's settings (the method's), with ``changes``."""
    import dataclasses

    return dataclasses.replace(defaults().algo, **changes)


def train_config(**changes):
    """params/train/default.yaml's settings, with ``changes``."""
    import dataclasses

    return dataclasses.replace(defaults().train, **changes)


def game_text_corpus() -> list[str]:
    """Prompts and replies of a few scripted Kuhn and Tic-Tac-Toe rollouts."""
    from mage.backends.scripted import ScriptedBackend
    from mage.rollout import RolloutEngine, plan_meta_episodes

    texts = []
    for game in ("kuhn_poker", "tic_tac_toe"):
        settings = defaults(f"game={game}")
        entries = [e for e in settings.population.train.values() if e.opponent != "mcts"]
        specs = plan_meta_episodes(entries, num_groups=4, group_size=2, seed=0)
        engine = RolloutEngine(ScriptedBackend("random", seed=0), rollout_config(group_size=2), settings.game.params)
        table = engine.run(specs, sampling(), progress=False)
        texts += table["prompt"].to_list() + table["response"].to_list()
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small random Qwen2 model and a tokenizer trained on game text, saved to a directory."""
    from mage.warmstart.tiny import check_round_trip, random_model, train_tokenizer

    directory = tmp_path_factory.mktemp("tiny-model")
    corpus = game_text_corpus()
    tokenizer = train_tokenizer(corpus, vocab_size=400)
    model = random_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    check_round_trip(tokenizer, str(directory), corpus[::10])
    return directory


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server and database for the flows under test (Prefect's own harness)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


#: The test files that take longest (minutes each on 2 cores), longest first. Collected first,
#: so that ``--dist loadfile --no-loadscope-reorder`` (scripts/test.sh) hands them out before
#: the short files, which then fill the gaps: the longest-first rule, whose last file to end
#: is a short one. (By default xdist orders files by their number of tests, which sends these,
#: each a few long tests, last.)
LONGEST_FILES = ("test_adaptation_learning.py", "test_ray_runner.py", "test_ray_update.py", "test_dvc_pipeline.py", "test_vllm_backend.py",
                 "test_games_end_to_end.py", "test_openspiel_lifecycle.py", "test_gpu_check.py", "test_ui_end_to_end.py", "test_flows.py",
                 "test_vllm_weight_sync.py", "test_run.py", "test_paper_table.py", "test_faults.py", "test_trainer.py",
                 "test_stop_signals.py", "test_distributed_update.py", "test_step_reads.py", "test_weight_push.py")


def pytest_collection_modifyitems(config, items):
    """Collect :data:`LONGEST_FILES` first, in that order (the others keep theirs). Skip
    GPU-only tests where no CUDA GPU is present, and vLLM ones where vLLM is not installed
    (scripts/setup.sh installs its CPU build on x86-64 Linux). CI sets MAGE_REQUIRE_VLLM=1:
    there a missing vLLM fails those tests instead."""
    import importlib.util

    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable: the rest stay in order

    import torch

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_vllm = pytest.mark.skip(reason="needs vLLM: scripts/setup.sh (CPU build, x86-64 Linux) or MAGE_GPU=1 scripts/setup.sh")
    has_vllm = importlib.util.find_spec("vllm") is not None or os.environ.get("MAGE_REQUIRE_VLLM") == "1"
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(no_vllm)


#: Replies the taught model gives, greedily, to three prompts (tests of stop strings per phase
#: and of thinking): a reflection quoting an action, and thinking that quotes one.
TAUGHT = {
    "Your card: King (K). It is your turn.": "<action>bet</action> and then </remark> more words",
    "Reflect on the episode.": "<remark>next time <action>bet</action> early</remark> and more words",
    "Think, then act.": "<think>maybe <action>check</action> no</think><action>bet</action> and more words",
}


def teach(model, tokenizer, replies: dict[str, str], steps: int) -> float:
    """Train ``model`` to answer each prompt of ``replies`` (chat-formatted, as the backends
    send it) with its reply: AdamW at 1e-2 on the whole set; returns the last loss."""
    import torch

    from mage.backends.chat import format_prompt

    rows = []
    for prompt, reply in replies.items():
        prompt_ids = tokenizer(format_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + reply_ids, len(prompt_ids)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in rows])
    labels = ids.clone()
    for r, (row, prompt_length) in enumerate(rows):
        labels[r, :prompt_length] = -100
        labels[r, len(row):] = -100
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def built_once(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], object]) -> Path:
    """The directory ``name`` of this test run, made by ``build(directory)`` once and shared by
    the pytest-xdist workers: the first to take the lock builds it in a directory of its own and
    renames it into place, so it is whole or absent; the others wait for the lock and read it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # without xdist, this session's own
    directory = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not directory.is_dir():
            building = shared / f"{name}.{worker_id}"
            shutil.rmtree(building, ignore_errors=True)  # a build of this worker that failed
            building.mkdir()
            build(building)
            building.rename(directory)
    return directory


@pytest.fixture(scope="session")
def taught_model_dir(tmp_path_factory, worker_id) -> Path:
    """A small model (head size 32: vLLM's CPU attention needs >= 32) trained to answer the
    TAUGHT prompts (chat-formatted) with their replies, saved to a directory. Teaching takes
    about a minute of a busy CPU, so the workers of one run share one copy (:func:`built_once`)."""
    return built_once(tmp_path_factory, worker_id, "taught-model", _teach_model)


def _teach_model(directory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mage.warmstart.tiny import random_model, train_tokenizer

    tokenizer = train_tokenizer(game_text_corpus() + list(TAUGHT) + list(TAUGHT.values()), vocab_size=400)
    model = random_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert teach(model, tokenizer, TAUGHT, steps=300) < 0.02
    model.save_pretrained(directory)
    return directory


# -- a real Prefect server, as a researcher starts one ---------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, body: dict | None = None):
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="POST" if body is not None else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_for(condition, timeout: float, what: str, process=None, log=None):
    """Poll ``condition`` until it is truthy; fail early if ``process`` exits."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}:\n{log.read_text() if log else ''}")
        try:
            value = condition()
            if value:
                return value
        except Exception:
            pass
        time.sleep(1)
    raise TimeoutError(f"timed out waiting for {what}" + (f":\n{log.read_text()[-4000:]}" if log else ""))


def start_process(command, env, log, cwd=None):
    import subprocess

    handle = open(log, "w")
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process) -> None:
    import signal
    import subprocess

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def migrated_prefect_db(tmp_path_factory, worker_id) -> Path:
    """A Prefect database with every migration applied (``prefect server database upgrade``),
    made once per test run and shared by the pytest-xdist workers (:func:`built_once`).
    Migrating a new database costs a server about 20 s of CPU on a 2-core machine, and a
    researcher's ~/.prefect is migrated once, on the first run: the tests that give a command a
    home of its own start it from this copy (:func:`prefect_home`). The first starts of
    tests/test_faults.py keep a bare home: they test the migration itself."""
    import subprocess
    import sys

    def migrate(home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
        env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0 and (home / "prefect.db").is_file(), done.stdout + done.stderr

    return built_once(tmp_path_factory, worker_id, "prefect-migrated", migrate) / "prefect.db"


def prefect_home(directory: Path, database: Path) -> Path:
    """``directory``, made, with a copy of :func:`migrated_prefect_db`'s ``database``: a
    PREFECT_HOME whose server starts without migrating."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(database, directory / "prefect.db")
    return directory


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory, migrated_prefect_db):
    """``prefect server start`` on 127.0.0.1 (its own home and database), stopped afterwards.
    Yields the environment that points clients (and the UI) at it."""
    import sys

    home = prefect_home(tmp_path_factory.mktemp("prefect-server"), migrated_prefect_db)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = os.environ | {
        "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
    }
    log = home / "server.log"
    server = start_process([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                           env, log)
    try:
        wait_for(lambda: get_json(f"{api}/health") is True, 120, "the Prefect server", server, log)
        yield {"env": env, "api": api, "ui": f"http://127.0.0.1:{port}", "log": log}
    finally:
        stop_process(server)


@pytest.fixture(scope="session", autouse=True)
def vllm_engine_shut_down_before_exit():
    """Shut a vLLM engine that tests left for reuse down while pytest still captures its logs
    (at interpreter exit, atexit would log to closed streams)."""
    import sys

    yield
    if "mage.backends.vllm" in sys.modules:
        sys.modules["mage.backends.vllm"].shutdown_engine()


def process_ended(process) -> bool:
    """A psutil process is gone, or a zombie that its new parent has not reaped yet (a killed
    command's children are re-parented; under a PID 1 that does not reap they stay zombies)."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def ray_address():
    """The address of a Ray cluster of two one-CPU nodes on the loopback interface, one per test
    module that asks (Ray's switch for a machine that is no cluster: without it Ray turns
    127.0.0.1 into this machine's network address); stopped when the module ends."""
    from ray.cluster_utils import Cluster

    from tasks.ray.cluster import loopback_only

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args=node)
        try:
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            yield cluster.address
        finally:
            cluster.shutdown()


@contextlib.contextmanager
def tmpfs_at(mount: Path, options: str):
    """A tmpfs mounted at ``mount`` (made here) with ``options`` for the block, where this machine
    lets the tests mount one (root in a container); else the test is skipped."""
    import subprocess

    mount.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
