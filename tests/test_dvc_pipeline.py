"""The DVC pipeline in a temporary clone of the working tree: experiment, reproduction, granularity,
push/pull, and the report's numbers against a recomputation from the trajectory table.

One module-scoped clone runs the whole (tiny) lifecycle once through ``dvc exp run -S ...``
(DVC composes params.yaml from params/ with the overrides); the tests then read what it left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyspiel
import pytest
import yaml
from conftest import process_ended

REPO = Path(__file__).resolve().parent.parent
#: A lifecycle small enough for a test: a tiny model with a short warm start, one iteration.
OVERRIDES = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=512",
    "model.tiny.corpus_meta_episodes=8", "model.tiny.bc_meta_episodes=32", "model.tiny.bc_steps=2", "model.tiny.bc_short_steps=2",
    # the warm start's check on two meta-episodes per split of short replies, cut as the games'
    # end-to-end tests cut it: at its default size (64, 128 tokens) it was most of the build's time
    "model.tiny.check_meta_episodes=2", "model.tiny.check_sampling.max_new_tokens=8",
    "train.iterations=1", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
    "engine.sampling.max_new_tokens=8", "eval.meta_episodes=4", "eval.episodes=2",
    "eval.sampling.max_new_tokens=8",
]


SERVER_ENV: dict[str, str] = {}  # the Prefect server every stage's flow reports to


def stage_env() -> dict[str, str]:
    env = os.environ | SERVER_ENV | {"DVC_NO_ANALYTICS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # stages call `python` of this environment
    # DVC runs a stage as `$SHELL -c cmd`. A POSIX sh that stays as the command's parent (dash,
    # /bin/sh on Debian, which CI had) is the harder case for a killed `dvc repro`: test with it.
    env["SHELL"] = "/bin/sh"
    return env


def main_command(*overrides: str) -> list[str]:
    """The README's main command on the tests' tiny lifecycle, with ``overrides`` after it."""
    return ["bash", "scripts/run.sh", *[item for o in [*OVERRIDES, *overrides] for item in ("-S", o)]]


def main_command_env() -> dict[str, str]:
    """The stages' environment, with the main command's setup skipped: its python is this test
    run's (stage_env's PATH), not a .venv of the clone's."""
    return stage_env() | {"MAGE_SKIP_SETUP": "1"}


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, env=stage_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}")
    return done.stdout + done.stderr


def dvc_status(root: Path, *flags: str) -> dict:
    """``dvc status --json``: what is out of date (``{}`` when nothing is), read from its stdout alone."""
    done = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", *flags], cwd=root, env=stage_env(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"dvc status failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def clone_working_tree(target: Path) -> None:
    """Tracked and untracked-but-not-ignored files of this checkout, committed in a fresh repository."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "commit", "-qm", "clone"]):
        subprocess.run(command, cwd=target, check=True, capture_output=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory, prefect_server):
    """A clone of the working tree where `dvc exp run` has run the tiny lifecycle once (the
    stages' flows report to one Prefect server instead of starting one each)."""
    SERVER_ENV.update({k: prefect_server["env"][k] for k in ("PREFECT_HOME", "PREFECT_API_URL")})
    root = tmp_path_factory.mktemp("clone")
    target = root / "mage-pipeline"
    target.mkdir()
    clone_working_tree(target)
    arguments = [item for override in OVERRIDES for item in ("-S", override)]
    output = run([sys.executable, "-m", "dvc", "exp", "run", *arguments], target)
    params = yaml.safe_load((target / "params.yaml").read_text())
    return {"root": target, "output": output, "params": params}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_committed_params_yaml_is_the_composition_of_params(tmp_path):
    from mage.config.compose import dump

    assert (REPO / "params.yaml").read_text() == dump(), "regenerate it: python -m mage config --output params.yaml"


@pytest.mark.parametrize("overrides", [
    ["game=kuhn_poker"], ["game=tic_tac_toe"], ["game=sokoban"], ["game=tic_tac_toe", "algo=grpo"],
    ["game=sokoban", "+experiment=paper"], ["+experiment=tic_tac_toe_long"], ["+experiment=sokoban_long"],
    ["+experiment=sokoban_levels"],
])
def test_dvc_composes_each_game_as_the_flows_do(overrides, tmp_path):
    """``dvc exp run -S game=...`` writes params.yaml with DVC's own Hydra composition: it must
    give the config the flows compose, per-game warm start and budget included."""
    from dvc.utils.hydra import compose_and_dump
    from omegaconf import OmegaConf

    from mage.config.compose import compose

    compose_and_dump(tmp_path / "params.yaml", str(REPO / "params"), None, "config", str(REPO), overrides)
    by_dvc = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert by_dvc == OmegaConf.to_container(compose(overrides), resolve=True)
    if by_dvc["model"]["name"] == "tiny":  # the game's own warm start, not Kuhn's
        game, rule = by_dvc["game"]["name"], by_dvc["model"]["tiny"]["bc_rules"][0]
        assert (rule if isinstance(rule, str) else rule["rule"]) == {
            "kuhn_poker": "timid", "tic_tac_toe": "beginner", "sokoban": "wanderer"}[game]


HEADLINE = ("final_win_rate", "final_win_vs_ceiling", "gain_over_start", "start_final_win_rate", "invalid_rate")


def experiments(shown: list) -> dict[str, dict]:
    """``dvc exp show --json``: each experiment's name -> its metrics files' data."""
    found = {}

    def walk(node):
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, dict) and node.get("name") and "metrics" in data:
                metrics = {path: body.get("data", {}) for path, body in (data["metrics"] or {}).items()}
                if any(metrics.values()):  # the baseline commit (the clone's branch) has none
                    found[node["name"]] = metrics
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(shown)
    return found


@pytest.mark.e2e
def test_exp_run_composes_params_and_records_metrics(clone):
    params = clone["params"]
    assert params["train"]["iterations"] == 1 and params["model"]["tiny"]["hidden_size"] == 32  # DVC's Hydra composition
    for stage in ("seed_population", "prepare_model", "train", "evaluate", "evaluate_start", "report"):
        assert f"Running stage '{stage}'" in clone["output"]
    metrics = json.loads((clone["root"] / params["paths"]["report"] / "metrics.json").read_text())
    for split in ("train", "held_out"):
        for field in HEADLINE:
            assert f"{split}/{field}" in metrics
    # the git-tracked copy that dvc exp show reads is the report's
    assert json.loads((clone["root"] / params["paths"]["metrics"]).read_text()) == metrics
    shown = experiments(json.loads(run([sys.executable, "-m", "dvc", "exp", "show", "--json"], clone["root"])))
    assert len(shown) == 1
    (recorded,) = shown.values()
    assert recorded[params["paths"]["metrics"]] == metrics  # read back, not "!"
    # Kuhn Poker: the final checkpoint's exploitability and its warm start's, as the evaluate stages measured them
    run_name = params["run"]["name"]
    for key, folder in (("exploitability", f"{params['paths']['evaluations']}/{run_name}/final"),
                        ("start_exploitability", params["paths"]["start_evaluation"])):
        measured = json.loads((clone["root"] / folder / "exploitability.json").read_text())
        assert metrics[key] == pytest.approx(measured["exploitability"], abs=1e-6)
    live = recorded[f"{params['paths']['live']}/metrics.json"]
    assert live["step"] == 1 and "rollout" in live  # dvclive's summary of the one iteration: its step is the iteration


@pytest.mark.e2e
def test_a_second_repro_does_nothing(clone):
    output = run([sys.executable, "-m", "dvc", "repro"], clone["root"])
    assert "Running stage" not in output
    assert "didn't change" in output or "up to date" in output


@pytest.mark.e2e
def test_a_parameter_change_reruns_only_the_dependent_stages(clone):
    root = clone["root"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["eval"]["meta_episodes"] = 6
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    output = run([sys.executable, "-m", "dvc", "repro"], root)
    ran = {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}
    assert ran == {"evaluate", "evaluate_start", "report"}, output


@pytest.mark.e2e
def test_push_and_pull_round_trip(clone):
    root = clone["root"]
    params = clone["params"]
    checkpoint_dir = root / params["paths"]["runs"] / params["run"]["name"]
    manifest = root / params["paths"]["population_manifest"]
    before = {p: file_digest(p) for p in [manifest, *sorted(checkpoint_dir.rglob("*.safetensors"))]}
    run([sys.executable, "-m", "dvc", "push"], root)
    remote = (root / ".dvc" / ".." / ".." / "mage-dvc-remote").resolve()
    assert remote.is_dir() and any(remote.rglob("*"))
    shutil.rmtree(root / ".dvc" / "cache")
    shutil.rmtree(root / params["paths"]["artifacts"])
    run([sys.executable, "-m", "dvc", "pull"], root)
    assert {p: file_digest(p) for p in before} == before
    # Nothing left to do: every output matches dvc.lock again, and the remote holds each cached one.
    assert dvc_status(root) == {} and dvc_status(root, "--cloud") == {}


@pytest.mark.e2e
def test_the_report_agrees_with_a_recomputation_from_the_trajectory_table(clone):
    root = clone["root"]
    params = clone["params"]
    report = json.loads((root / params["paths"]["report"] / "report.json").read_text())
    manifest = json.loads((root / params["paths"]["population_manifest"]).read_text())
    table = pl.read_parquet(root / params["paths"]["evaluations"] / params["run"]["name"] / "final" / "held_out.parquet")
    ceilings = {o["id"]: o["ceilings"] for o in manifest["opponents"]}
    rows = {r["opponent"]: r for r in report["splits"]["held_out"]["opponents"]}
    kuhn = pyspiel.load_game("kuhn_poker")
    for opponent, calls in table.group_by("opponent"):
        opponent = opponent[0]
        # By hand: each meta-episode's episodes, in order; its final one is the last it played.
        finals, firsts, state_ceilings = [], [], []
        for _, meta in calls.filter(pl.col("phase") == "play").group_by("meta_id"):
            episodes = meta.sort("episode", "turn").group_by("episode", maintain_order=True).first()
            firsts.append(episodes.row(0, named=True))
            finals.append(episodes.row(-1, named=True))
            # The win ceiling of this meta-episode's own deal and seat, from the manifest.
            seat, cards = int(meta["seat"][0]), json.loads(meta["initial_state"][0])["data"]["cards"]
            state = kuhn.new_initial_state()
            for card in cards:
                state.apply_action(card)
            figure = ceilings[opponent][f"seat_{seat}"]["max_win_probability"]
            state_ceilings.append(figure["per_initial_state"][state.history_str()] if "per_initial_state" in figure
                                  else figure["value"])
        mine = rows[opponent]
        assert mine["meta_episodes"] == len(finals)
        assert mine["final_win_rate"] == pytest.approx(sum(f["won"] for f in finals) / len(finals))
        assert mine["first_win_rate"] == pytest.approx(sum(f["won"] for f in firsts) / len(firsts))
        assert mine["final_mean_return"] == pytest.approx(sum(f["episode_return"] for f in finals) / len(finals))
        assert mine["max_win_probability"] == pytest.approx(sum(state_ceilings) / len(state_ceilings))
        play = calls.filter(pl.col("phase") == "play")
        assert mine["invalid_rate"] == pytest.approx(1 - play["valid"].sum() / play.height)


@pytest.mark.e2e
def test_a_second_experiment_beside_a_running_one_is_refused_and_two_experiments_compare(clone):
    """The README's main command twice at once in one clone: the second ends at once with one
    line (it would have written its values into the first's params.yaml); the first (GRPO) runs
    to the end with its own values, saved as an experiment, and leaves the workspace in step.
    A DVC command started by hand (DVC's own lock held) is refused the same way. MAGE (the
    fixture's experiment) and that GRPO one compare side by side: both rows of `dvc exp show`
    carry their params and metrics, and `dvc plots diff` draws their training curves together."""
    import time

    import zc.lockfile

    root = clone["root"]
    env = main_command_env()

    def grpo_command(*overrides: str) -> list[str]:
        return main_command("algo=grpo", "engine.episodes=1", *overrides)

    pid_file = root / ".dvc" / "tmp" / "mage-experiment.pid"
    pid_file.unlink(missing_ok=True)
    log = root.parent / "first-experiment.log"
    with open(log, "w") as out:
        first = subprocess.Popen(grpo_command("eval.meta_episodes=8"), cwd=root, env=env, stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text().strip() == str(first.pid)) and time.monotonic() < deadline:
        assert first.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    second = subprocess.run(grpo_command("eval.meta_episodes=12"), cwd=root, env=env, capture_output=True, text=True)
    assert first.poll() is None, "the first experiment ended before the second was tried"
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [line for line in second.stderr.strip().splitlines()
                                                  if line.startswith("error: an experiment is already running")]
    assert len(second.stderr.strip().splitlines()) == 1 and f"pid {first.pid}" in second.stderr
    assert first.wait(600) == 0, log.read_text()[-3000:]
    output = log.read_text()
    assert "Running stage 'train'" in output and "Running stage 'prepare_model'" not in output  # same warm start
    assert yaml.safe_load((root / "params.yaml").read_text())["eval"]["meta_episodes"] == 8  # the first's own
    assert dvc_status(root) == {}
    shown = json.loads(run([sys.executable, "-m", "dvc", "exp", "show", "--json"], root))
    assert '"meta_episodes": 8' in json.dumps(shown) and '"meta_episodes": 12' not in json.dumps(shown)
    rows = experiments(shown)
    assert len(rows) == 2
    metrics_file = clone["params"]["paths"]["metrics"]
    for metrics in rows.values():
        assert all(isinstance(metrics[metrics_file][f"{s}/{f}"], float) for s in ("train", "held_out") for f in HEADLINE)
    assert '"algo=grpo"' not in json.dumps(shown) and '"grpo"' in json.dumps(shown)  # the composed params, not the override
    names = sorted(rows)
    plots = run([sys.executable, "-m", "dvc", "plots", "diff", *names, "--json"], root)
    assert all(name in plots for name in names)

    held = zc.lockfile.LockFile(str(root / ".dvc" / "tmp" / "lock"))  # as a running `dvc repro` holds it
    try:
        refused = subprocess.run(grpo_command("eval.meta_episodes=12"), cwd=root, env=env, capture_output=True,
                                 text=True)
    finally:
        held.close()
    assert refused.returncode == 2 and refused.stderr.startswith("error: a DVC command is running in this clone")
    assert yaml.safe_load((root / "params.yaml").read_text())["eval"]["meta_episodes"] == 8  # untouched


@pytest.mark.e2e
def test_a_killed_main_command_leaves_no_stage_running_and_resumes(clone):
    """SIGKILL the main command's `dvc` in the middle of training: its stage process ends with
    it, and the same command again resumes from the iterations it had finished and records the
    experiment. (`dvc exp run` alone would not: it checks the outputs out of dvc.lock first, by
    force, and the unfinished run directory went with them; scripts/run.sh finishes an
    interrupted experiment with `dvc repro`, which keeps the `persist`ent run directory.)"""
    import signal
    import time

    import psutil

    root = clone["root"]
    env = main_command_env()
    lengthened = main_command("train.iterations=6")
    params = clone["params"]  # the fixture's experiment, lengthened from 1 iteration to 6
    checkpoints = root / params["paths"]["runs"] / params["run"]["name"] / "checkpoints"

    def finished() -> list[str]:
        return sorted(p.name for p in checkpoints.glob("ckpt-*") if (p / "manifest.json").is_file())

    def latest() -> int:
        return int(finished()[-1].removeprefix("ckpt-")) if finished() else 0

    log = root.parent / "killed-main-command.log"
    with open(log, "w") as out:
        main = subprocess.Popen(lengthened, cwd=root, env=env, stdout=out, stderr=out)
    deadline = time.monotonic() + 300
    while latest() < 2 and time.monotonic() < deadline:
        assert main.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    assert latest() >= 2, f"no second iteration within 300 s:\n{log.read_text()[-3000:]}"
    dvc = next(p for p in psutil.Process(main.pid).children() if "dvc" in p.cmdline())
    stage = [p for p in dvc.children(recursive=True) if "flows" in p.cmdline()]
    at_kill = latest()
    dvc.send_signal(signal.SIGKILL)
    assert main.wait(30) != 0
    assert stage, "no stage process was running"
    deadline = time.monotonic() + 60
    while not all(process_ended(p) for p in stage) and time.monotonic() < deadline:  # PR_SET_PDEATHSIG ends it
        time.sleep(0.1)
    assert all(process_ended(p) for p in stage), "the stage process outlived dvc"
    killed_at = finished()
    time.sleep(2)
    assert finished() == killed_at, "training went on after dvc was killed"
    done = latest()
    assert done <= at_kill + 1, f"the stage trained on after dvc was killed (ckpt {at_kill} -> {done})"  # +1: in flight
    assert done < 6, "the kill came too late to test anything"
    again = subprocess.run(lengthened, cwd=root, env=env, capture_output=True, text=True)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-4000:]
    assert "Running stage 'train'" in output and "Running stage 'prepare_model'" not in output
    import re

    updates = dict(re.findall(r"Task run 'update-(\d+)' - Finished in state (\w+)", output))
    # the run resumes from its newest checkpoint: only the iterations after it run
    assert updates == {str(i): "Completed" for i in range(done + 1, 7)}, output[-4000:]
    assert re.search(rf"resumed from \S+/checkpoints/ckpt-{done:05d} \(iteration {done}\)", output), output[-4000:]
    assert finished()[-1] == "ckpt-00006" and not list(checkpoints.glob(".ckpt-*"))  # done, no debris
    shown = json.loads(run([sys.executable, "-m", "dvc", "exp", "show", "--json"], root))
    assert '"iterations": 6' in json.dumps(shown)  # recorded as an experiment
    assert "up to date" in run([sys.executable, "-m", "dvc", "status"], root)
