"""Checkpoints written behind the next rollout (``train.write_behind``, mage.run.loop.writes_behind):
where it applies, that the write overlaps the rollout and ends before the next update, that a
run writes the same files either way, that a failed write is made again before the update,
and that one failing twice stops the run at the next update and resumes to an uninterrupted
run's weights."""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest

from mage import io
from mage.models import checkpoint as ckpt
from mage.run import RunLayout, loop, train
from mage.settings import load_settings

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
    # Ray's long-lived rollout workers are pushed full weights, named by the checkpoint's id; Ray
    # Train's workers start from the checkpoint after the update's wait
    (["train.workers=2", "flow.runner=ray"], [True, True, True, False]),
    (["flow.runner=ray", "engine.backend=vllm"], [True, True, True, False]),
    (["flow.runner=process"], [False] * 4),  # rollout processes sample from the checkpoint
    (["flow.runner=ray", "flow.ray.long_lived_workers=false"], [False] * 4),  # ... and Ray tasks
    (["train.workers=2", "flow.runner=ray", "flow.ray.long_lived_workers=false"], [False] * 4),
    (["flow.runner=ray", "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}"],
     [False] * 4),  # an adapter goes by its path
    (["flow.runner=ray", "engine.backend=vllm", "engine.vllm.weight_sync=disk"], [False] * 4),
    (["engine.backend=vllm", "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}"],
     [False] * 4),  # the engine loads the adapter
    (["engine.backend=vllm", "engine.vllm.weight_sync=disk"], [False] * 4),  # ... or the weights
    (["engine.backend=vllm"], [True, True, True, False]),  # pushed through memory, named by the checkpoint
    (["+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}"], [True, True, True, False]),  # hf
])
def test_a_checkpoint_is_written_behind_only_where_nothing_reads_it_before_the_next_update(overrides, behind):
    settings = load_settings(["train.iterations=4", *overrides])
    assert [loop.writes_behind(settings, i) for i in range(1, 5)] == behind


def writes_by_thread(monkeypatch, slow_seconds: float = 0.0, failures: dict[int, int] | None = None) -> list[tuple]:
    """Record each checkpoint write's (iteration, thread, start, end); optionally slow the writer
    thread's writes from inside (the weights are written while the rollout plays), or refuse an
    iteration's first ``failures[iteration]`` writes as a full disk."""
    writes: list[tuple] = []
    failures = dict(failures or {})
    real = io.replace_directory

    def replace_directory(path, write):
        if not path.name.startswith(ckpt.PREFIX):
            return real(path, write)
        iteration, thread, started = int(path.name[len(ckpt.PREFIX):]), threading.current_thread().name, \
            time.perf_counter()

        def slowly(tmp):
            if thread.startswith(WRITER):
                time.sleep(slow_seconds)
            if failures.get(iteration, 0) > 0:
                failures[iteration] -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(tmp)

        done = real(path, slowly)
        writes.append((iteration, thread, started, time.perf_counter()))
        return done

    monkeypatch.setattr(io, "replace_directory", replace_directory)
    return writes


def update_starts(monkeypatch) -> dict[int, float]:
    """When each iteration's optimizer work began (after the update step's wait)."""
    from mage.trainer.policy_trainer import PolicyTrainer

    starts: dict[int, float] = {}
    real = PolicyTrainer.update

    def update(self, table, *args, **kwargs):
        starts[int(table["iteration"][0])] = time.perf_counter()
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(PolicyTrainer, "update", update)
    return starts


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
    writes = writes_by_thread(monkeypatch, slow_seconds=0.5)
    updates = update_starts(monkeypatch)
    behind = run(tiny_model_dir, tmp_path / "behind")
    assert train(behind, progress=False).iterations == [1, 2, 3]
    assert [(i, t.startswith(WRITER)) for i, t, *_ in writes] == [(1, True), (2, True), (3, False)]
    # the next rollout began before the checkpoint before it was written (each write waits 0.5 s
    # inside here, then writes the weights while the rollout plays), and the update after it
    # only once it was
    for iteration, _, _, ended in writes[:2]:
        assert rollouts[iteration + 1] < ended < updates[iteration + 1], (iteration, writes, rollouts, updates)

    writes.clear()
    in_turn = run(tiny_model_dir, tmp_path / "in_turn", "train.write_behind=false")
    assert train(in_turn, progress=False).iterations == [1, 2, 3]
    assert all(not t.startswith(WRITER) for _, t, *_ in writes) and len(writes) == 3

    a, b = RunLayout.of(behind), RunLayout.of(in_turn)
    assert a.metrics.read_bytes() == b.metrics.read_bytes()
    kept = [c.iteration for c in ckpt.list_checkpoints(a.checkpoints)]
    assert kept == [c.iteration for c in ckpt.list_checkpoints(b.checkpoints)] == [1, 2, 3]
    # every file the same bytes (the manifest's hashes), torch's RNG state included (a rollout draws
    # from it: taken at the write, it would differ). Python's global RNG is not compared: mage never
    # draws from it, so its state is whatever the process's other threads left (in the full suite, a
    # leftover background thread of an earlier test drew from it between the two runs).
    for iteration in kept:
        name = f"{ckpt.PREFIX}{iteration:05d}"
        first, second = (json.loads((layout.checkpoints / name / ckpt.MANIFEST).read_text()) for layout in (a, b))
        assert first["files"] == second["files"], iteration
        assert ckpt.is_complete(a.checkpoints / name)


@pytest.mark.e2e
def test_a_failed_write_behind_is_made_again_and_a_second_failure_stops_the_run_at_the_next_update(
        tiny_model_dir, tmp_path, monkeypatch):
    whole = run(tiny_model_dir, tmp_path / "whole")
    train(whole, progress=False)

    once = run(tiny_model_dir, tmp_path / "once")  # checkpoint 2 refused once: written again before update 3
    writes_by_thread(monkeypatch, failures={2: 1})
    assert train(once, progress=False).iterations == [1, 2, 3]
    for name in ("metrics.jsonl", "final.json"):
        assert (RunLayout.of(once).root / name).read_bytes() == (RunLayout.of(whole).root / name).read_bytes(), name
    monkeypatch.undo()

    parts = run(tiny_model_dir, tmp_path / "parts")  # refused twice: the run stops at update 3
    writes_by_thread(monkeypatch, failures={2: 2})
    with pytest.raises(io.StorageError, match="ckpt-00002"):
        train(parts, progress=False)
    layout = RunLayout.of(parts)
    assert [json.loads(line)["iteration"] for line in layout.metrics.read_text().splitlines()] == [1, 2]
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


def test_a_checkpoint_keeps_the_generation_config_and_tokenizer_of_when_it_was_asked_for(tiny_model_dir, tmp_path):
    """The hf backend swaps the model's generation config for a blank one during ``generate``
    (mage.backends.hf._without_model_defaults): a checkpoint written behind, while a rollout
    generates, must still hold the model's own, as a checkpoint written in turn does."""
    import torch
    from transformers import GenerationConfig

    from mage.models.policy import load_policy

    policy = load_policy(str(tiny_model_dir), device="cpu")
    optimizer = torch.optim.AdamW(policy.model.parameters())
    policy.model.generation_config.eos_token_id = [3, 5]  # not transformers' default
    in_turn = ckpt.save_checkpoint(tmp_path / "in_turn", 1, policy, optimizer, config_hash="x", parent=None,
                                   metrics={})
    asked, write = ckpt.checkpoint_writer(tmp_path / "behind", 1, policy, optimizer, config_hash="x", parent=None,
                                          metrics={})
    assert "files" not in asked.manifest and asked.iteration == 1
    own, policy.model.generation_config = policy.model.generation_config, GenerationConfig()  # generate is running
    written = write()
    policy.model.generation_config = own
    assert json.loads((written.path / "generation_config.json").read_text())["eos_token_id"] == [3, 5]
    assert written.manifest["files"] == in_turn.manifest["files"]



def test_a_write_behind_failing_twice_is_raised_by_every_wait_and_marked_for_readers_elsewhere(tiny_model_dir,
                                                                                                tmp_path):
    """The writer thread makes a refused write once more; failing again, every later wait raises
    it (a retried update must not start from a checkpoint that is not there), and a reader in
    another process waiting for it (a restarted Ray rollout worker) is told at once, not after
    the timeout. A later write of that checkpoint removes the mark."""
    from mage.run.state import start_training

    settings = run(tiny_model_dir, tmp_path)
    state = start_training(settings)
    try:
        asked, write = ckpt.checkpoint_writer(RunLayout.of(settings).checkpoints, 1, state.policy,
                                              state.trainer.optimizer, config_hash="x", parent=None, metrics={})
        tries = []

        def refused():
            tries.append(threading.current_thread().name)
            raise OSError(errno.ENOSPC, "No space left on device")

        state.checkpoint = asked
        state.write_behind(refused)
        for _ in range(2):  # sticky: the second wait raises too
            with pytest.raises(OSError, match="No space"):
                state.wait_for_checkpoint()
        assert len(tries) == 2 and all(name.startswith(WRITER) for name in tries)
        started = time.monotonic()
        with pytest.raises(ckpt.UnwrittenCheckpoint, match="failed to write") as refusal:
            ckpt.wait_until_written(asked.path, ckpt.weights_id(asked), timeout=60)
        assert time.monotonic() - started < 10 and refusal.value.transient is False
        with pytest.raises(ckpt.UnwrittenCheckpoint, match="waited 0.5 s"):  # other weights: not marked
            ckpt.wait_until_written(asked.path, "another checkpoint's id", timeout=0.5)
        state.close()  # logs the failure; the run is ending
        state.wait_for_checkpoint()
        written = write()  # resumed, the checkpoint is written: the mark goes
        assert ckpt.wait_until_written(asked.path, ckpt.weights_id(asked), timeout=5).path == written.path
        assert not list(written.path.parent.glob(".*.unwritten"))
    finally:
        state.close()
