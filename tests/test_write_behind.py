"""Checkpoints written behind the next rollout (``train.write_behind``, mage.run.loop.writes_behind):
where it applies, that the write overlaps the rollout, that a run writes the same files either
way, and that a failed write stops the run at the next update and resumes to an uninterrupted
run's weights."""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest

from mage import io
from mage.run import RunLayout, loop, train
from mage.settings import load_settings
from mage.train import checkpoint as ckpt

WRITER = "checkpoint-writer"  # the thread name of TrainingState.write_behind


def run(model_dir, root, *extra: str):
    return load_settings([
        f"model.path={model_dir}", "model.build=null", "train.iterations=3", "train.learning_rate=1e-3",
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=6", "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6",
        f"paths.artifacts={root}", f"paths.results={root}/results", "paths.live=null", *extra,
    ])


@pytest.mark.parametrize(("overrides", "behind"), [
    ([], [True, True, True, False]),  # the last checkpoint is final.json's
    (["train.write_behind=false"], [False] * 4),
    (["train.eval_every=2"], [True, False, True, False]),  # an evaluated checkpoint is loaded at once
    (["+experiment=kuhn_poker_league", "population.league.snapshot_every=2"], [True, False, True, False]),
    (["train.workers=2", "flow.runner=ray"], [False] * 4),  # Ray Train's workers write and read checkpoints
    (["flow.runner=process"], [False] * 4),  # rollout processes sample from the checkpoint
    (["engine.backend=vllm", "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}"],
     [False] * 4),  # the engine loads the adapter
    (["engine.backend=vllm", "engine.vllm.weight_sync=disk"], [False] * 4),  # ... or the weights
    (["engine.backend=vllm"], [True, True, True, False]),  # pushed through memory, named by the checkpoint
])
def test_a_checkpoint_is_written_behind_only_where_nothing_reads_it_before_the_next_update(overrides, behind):
    settings = load_settings(["train.iterations=4", *overrides])
    assert [loop.writes_behind(settings, i) for i in range(1, 5)] == behind


def writes_by_thread(monkeypatch, slow_seconds: float = 0.0, fail_iteration: int | None = None) -> list[tuple]:
    """Record each checkpoint write's (iteration, thread, start, end); optionally slow the writer
    thread's writes, or refuse one iteration's as a full disk."""
    writes: list[tuple] = []
    real = io.replace_directory

    def replace_directory(path, write):
        if not path.name.startswith(ckpt.PREFIX):
            return real(path, write)
        iteration, thread, started = int(path.name[len(ckpt.PREFIX):]), threading.current_thread().name, \
            time.perf_counter()
        if thread.startswith(WRITER):
            time.sleep(slow_seconds)

        def full_disk(tmp):
            raise OSError(errno.ENOSPC, "No space left on device")

        done = real(path, full_disk if iteration == fail_iteration else write)
        writes.append((iteration, thread, started, time.perf_counter()))
        return done

    monkeypatch.setattr(io, "replace_directory", replace_directory)
    return writes


@pytest.mark.e2e
def test_a_run_written_behind_leaves_what_a_run_written_in_turn_leaves_and_the_write_overlaps_the_rollout(
        tiny_model_dir, tmp_path, monkeypatch):
    from mage.run import steps

    rollouts: dict[int, float] = {}
    real_rollout = steps.rollout

    def rollout(settings, backend, iteration, *args, **kwargs):
        rollouts.setdefault(iteration, time.perf_counter())
        return real_rollout(settings, backend, iteration, *args, **kwargs)

    monkeypatch.setattr(steps, "rollout", rollout)
    writes = writes_by_thread(monkeypatch, slow_seconds=1.0)
    behind = run(tiny_model_dir, tmp_path / "behind")
    assert train(behind, progress=False).iterations == [1, 2, 3]
    assert [(i, t.startswith(WRITER)) for i, t, *_ in writes] == [(1, True), (2, True), (3, False)]
    # the next rollout began before the checkpoint before it was written (each write takes 1 s more here)
    for iteration, _, _, ended in writes[:2]:
        assert rollouts[iteration + 1] < ended, (iteration, writes, rollouts)

    writes.clear()
    in_turn = run(tiny_model_dir, tmp_path / "in_turn", "train.write_behind=false")
    assert train(in_turn, progress=False).iterations == [1, 2, 3]
    assert all(not t.startswith(WRITER) for _, t, *_ in writes) and len(writes) == 3

    a, b = RunLayout.of(behind), RunLayout.of(in_turn)
    assert a.metrics.read_bytes() == b.metrics.read_bytes()
    kept = [c.iteration for c in ckpt.list_checkpoints(a.checkpoints)]
    assert kept == [c.iteration for c in ckpt.list_checkpoints(b.checkpoints)] == [1, 2, 3]
    for iteration in kept:  # every file the same bytes (the manifest's hashes), the RNG state included
        name = f"{ckpt.PREFIX}{iteration:05d}"
        first, second = (json.loads((layout.checkpoints / name / ckpt.MANIFEST).read_text()) for layout in (a, b))
        assert first["files"] == second["files"] and first["python_rng"] == second["python_rng"], iteration
        assert ckpt.is_complete(a.checkpoints / name)


@pytest.mark.e2e
def test_a_failed_write_behind_stops_the_run_at_the_next_update_and_the_run_resumes_to_the_same_weights(
        tiny_model_dir, tmp_path, monkeypatch):
    whole = run(tiny_model_dir, tmp_path / "whole")
    train(whole, progress=False)

    parts = run(tiny_model_dir, tmp_path / "parts")
    writes_by_thread(monkeypatch, fail_iteration=2)
    with pytest.raises(io.StorageError, match="ckpt-00002"):
        train(parts, progress=False)
    layout = RunLayout.of(parts)
    assert [c.iteration for c in ckpt.list_checkpoints(layout.checkpoints)] == [1]  # nothing half-written
    assert not [p for p in layout.checkpoints.iterdir() if io.STALE_TEMPORARY.fullmatch(p.name)]
    assert not layout.final.exists()

    monkeypatch.undo()
    assert train(parts, progress=False).iterations == [2, 3]  # from checkpoint 1
    for name in ("metrics.jsonl", "final.json"):
        assert (layout.root / name).read_bytes() == (RunLayout.of(whole).root / name).read_bytes(), name
    name = f"{ckpt.PREFIX}00003"
    assert (layout.checkpoints / name / "model.safetensors").read_bytes() == \
        (RunLayout.of(whole).checkpoints / name / "model.safetensors").read_bytes()
