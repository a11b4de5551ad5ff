"""Each step declares the settings it reads (``mage.run.reads.READS``), and the declarations
are what the code reads: every step runs here on the tiny preset while every attribute read
of the settings is recorded, and each read must be declared and each declaration read.

What is derived from the declarations is checked with them: the tasks' cache keys, the
rollout worker's key, the run's identity (``run.json``); ``dvc.yaml``'s params are checked in
``tests/test_dvc_dependencies.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest

from mage.run import steps
from mage.run.reads import LOOP_STEPS, READS, run_identity
from mage.settings import Settings, load_settings

SMALL_BUILD = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64",
               "model.tiny.vocab_size=512", "model.tiny.corpus_meta_episodes=8", "model.tiny.bc_meta_episodes=8",
               "model.tiny.bc_steps=1", "model.tiny.bc_short_steps=1", "model.tiny.check_meta_episodes=2",
               "model.tiny.check_sampling.max_new_tokens=4"]


def run_overrides(model_dir, tmp_path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", "model.build=null", "train.iterations=1", "train.mini_batch_size=8",
            "engine.groups=2", "engine.group_size=2", "engine.episodes=2", "engine.sampling.max_new_tokens=6",
            "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6", f"paths.artifacts={tmp_path}",
            f"paths.results={tmp_path}/results", *extra]


def _sections(value: object, path: str, out: dict[int, str]) -> None:
    """Every section object under ``value`` (dataclass instances), by id, with its dotted path."""
    out[id(value)] = path
    for field in dataclasses.fields(value):
        child = object.__getattribute__(value, field.name)
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            _sections(child, f"{path}.{field.name}".lstrip("."), out)


@contextlib.contextmanager
def recording(settings: Settings) -> Iterator[set[str]]:
    """Inside: every read of a field of ``settings`` or of one of its sections, wherever the
    object has travelled (a trainer keeps ``settings.train``), as a dotted config key. A read of
    a section itself is not recorded, only of what it holds (a whole mapping counts as one read)."""
    paths: dict[int, str] = {}
    _sections(settings, "", paths)
    classes = {type(obj) for obj in _all(settings)}
    read: set[str] = set()
    originals = {cls: cls.__getattribute__ for cls in classes}

    def spy(self, name):
        value = object.__getattribute__(self, name)
        where = paths.get(id(self))
        if where is not None and name != "raw" and name in {f.name for f in dataclasses.fields(type(self))} \
                and id(value) not in paths:
            read.add(f"{where}.{name}".lstrip("."))
        return value

    for cls in classes:
        cls.__getattribute__ = spy
    try:
        yield read
    finally:
        for cls, original in originals.items():
            cls.__getattribute__ = original


def _all(settings: Settings) -> list[object]:
    found: dict[int, str] = {}
    _sections(settings, "", found)
    objects = [settings]
    stack = [settings]
    while stack:
        obj = stack.pop()
        for field in dataclasses.fields(obj):
            child = object.__getattribute__(obj, field.name)
            if dataclasses.is_dataclass(child) and not isinstance(child, type):
                objects.append(child)
                stack.append(child)
    return objects


def covered(key: str, declared: tuple[str, ...]) -> bool:
    return any(key == d or key.startswith(d + ".") for d in declared)


def used(declared: str, read: set[str]) -> bool:
    return any(r == declared or r.startswith(declared + ".") or declared.startswith(r + ".") for r in read)


#: Declared keys that only another backend than those run here reads, and why.
ELSEWHERE = {
    ("start", "engine.vllm"): "the vllm backend's options",
    ("start", "seed"): "the vllm engine's seed",
    ("evaluate", "seed"): "the vllm engine's seed",
    ("exploitability", "seed"): "the vllm engine's seed",
}


def check(step: str, read: set[str]) -> None:
    undeclared = sorted(r for r in read if not covered(r, READS[step]))
    assert not undeclared, f"step {step!r} reads {undeclared}, which mage.run.reads.READS does not declare"
    unread = [d for d in READS[step] if not used(d, read) and (step, d) not in ELSEWHERE]
    assert not unread, f"step {step!r} declares {unread}, which it never read here"


def test_the_recorder_sees_reads_through_properties_and_kept_sections():
    settings = load_settings()
    kept = settings.train
    with recording(settings) as read:
        assert settings.run_name and settings.game.num_players == 2
        kept.learning_rate_at(3)
        _ = settings.engine  # a section alone is no read
    assert read == {"run.name", "game.name", "game.params", "train.lr_schedule", "train.learning_rate"}


@pytest.fixture(scope="module")
def every_step(tiny_model_dir, tmp_path_factory) -> dict[str, set[str]]:
    """Each step run once on the tiny preset, with what it read."""
    from mage.evaluation.play import write_exploitability
    from mage.population.manifest import seed_population, write_manifest
    from mage.run.evaluation import Policy, report_about
    from mage.run.state import start_training
    from mage.run.worker import RolloutWorker
    from mage.warmstart import prepare_model
    from tasks.evaluation import write_report
    from tasks.refs import FileRef

    tmp_path = tmp_path_factory.mktemp("reads")
    found: dict[str, set[str]] = {}
    settings = load_settings(run_overrides(tiny_model_dir, tmp_path))
    with recording(settings) as read:
        write_manifest(seed_population(settings, progress=False), settings.paths.population_manifest)
    found["seed_population"] = read
    build = load_settings([*SMALL_BUILD, f"paths.artifacts={tmp_path}/build", "model.device=cpu"])
    with recording(build) as read:
        prepare_model(build, progress=False)
    found["prepare_model"] = read
    with recording(settings) as read:
        state = start_training(settings)
        state.backend()
    found["start"] = read
    scripted = load_settings(run_overrides(tiny_model_dir, tmp_path / "scripted", "engine.backend=scripted"))
    with recording(scripted) as read:
        start_training(scripted).backend()
    found["start"] |= read
    with recording(settings) as read:
        worker = RolloutWorker(settings)
        path, _ = steps.play_shard(worker, 1, None, 0)
        worker.close()
    found["rollout"] = read
    from mage.rollout import read_trajectories

    with recording(settings) as read:
        table = steps.score(settings, [read_trajectories(path)], 1)
    found["score"] = read
    linear = load_settings(run_overrides(tiny_model_dir, tmp_path / "linear", "train.lr_schedule=linear"))
    linear_state = start_training(linear)
    with recording(linear) as read:
        saved = steps.save(linear_state, steps.update(linear_state, table, 1))
    found["update"] = read
    leagued = load_settings(run_overrides(tiny_model_dir, tmp_path / "league", "population.league.enabled=true"))
    with recording(leagued) as read:
        steps.advance_league(leagued, table, 5)  # a snapshot joins at 5 (snapshot_every)
    found["league"] = read
    with recording(linear) as read:  # a checkpoint's, in an evaluation
        write_exploitability(linear, saved, tmp_path / "exploitability")
    found["exploitability"] = read
    with recording(linear) as read:  # where it goes by default: the checkpoint's folder, and the start's
        evaluated = steps.evaluate(linear, saved, "held_out")
        steps.evaluate(linear, None, "held_out")
    found["evaluate"] = read
    manifest = FileRef.of(settings.paths.population_manifest)
    with recording(settings) as read:  # what the report says it is about, then the report (mage.run.evaluation)
        about = report_about(settings, Policy.at(saved.path), None, None)
        write_report.fn(settings, manifest, {"held_out": FileRef.of(evaluated["table"])}, about, str(tmp_path / "report"))
    found["report"] = read
    state.close()
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("step", sorted(set(READS) - {"loop"}))
def test_a_step_reads_what_it_declares(every_step, step):
    check(step, every_step[step])


@pytest.mark.e2e
def test_the_loop_reads_only_its_steps_and_its_schedule(tiny_model_dir, tmp_path):
    from mage.run import train

    settings = load_settings(run_overrides(tiny_model_dir, tmp_path, "train.iterations=2", "train.eval_every=2"))
    with recording(settings) as read:
        train(settings, progress=False)
    everything = tuple(key for step in (*LOOP_STEPS, "loop") for key in READS[step])
    undeclared = sorted(r for r in read if not covered(r, everything))
    assert not undeclared, f"the loop reads {undeclared}, which neither it nor its steps declare"
    unread = [d for d in READS["loop"] if not used(d, read)]
    assert not unread, f"the loop declares {unread}, which it never read here"


def test_what_keys_a_step_is_derived_from_its_declaration():
    from tasks.caching import ArtifactCachePolicy
    from tasks.evaluation import evaluate_split, write_report
    from tasks.model import prepare_model
    from tasks.population import seed_population

    for task, step in ((seed_population, "seed_population"), (prepare_model, "prepare_model"),
                       (evaluate_split, "evaluate"), (write_report, "report")):
        assert isinstance(task.cache_policy, ArtifactCachePolicy) and task.cache_policy.sections == READS[step]
    # a run's identity is what its iterations read, less where files go and the schedule
    base = load_settings()
    for override, same in (("algo.grouping=mixed", False), ("engine.sampling.top_k=7", False),
                           ("flow.rollout_shards=2", False), ("game.invalid_penalty=1.5", False),
                           ("train.iterations=40", True), ("train.checkpoint_every=5", True),
                           ("paths.artifacts=elsewhere", True), ("flow.runner=sequential", True),
                           ("eval.meta_episodes=9", True), ("run.name=other", True),
                           ("train.micro_batch_tokens=512", True), ("engine.hf.batch_size=8", True),
                           ("model.device=cpu", True), ("train.gradient_checkpointing=true", True)):
        changed = load_settings([override])
        assert (run_identity(changed) == run_identity(base)) is same, override
    # with a linear schedule every iteration's rate depends on how many there are
    linear = load_settings(["train.lr_schedule=linear"])
    assert run_identity(load_settings(["train.lr_schedule=linear", "train.iterations=40"])) != \
        run_identity(linear)
