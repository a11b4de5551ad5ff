"""A rollout worker in another process (a Ray actor's) takes an update's full weights through
memory (RolloutWorker.take_weights), checked, in place of reading the checkpoint back: here
with the ``hf`` backend in this process; tests/test_vllm_weight_sync.py takes them into a vLLM
engine, and tests/test_ray_runner.py through Ray's object store in the train flow.

The reference for every check is the checkpoint on disk, read by a second worker as before:
the pushed worker must hold its weights bit for bit and play its table."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mage.backends import weight_sync
from mage.models import checkpoint as ckpt
from mage.rollout import read_trajectories
from mage.run import steps
from mage.run.state import probe_logprobs, start_training
from mage.run.worker import RolloutWorker
from mage.settings import load_settings


def run_overrides(model_dir, tmp_path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", "model.build=null", "train.iterations=2", "train.mini_batch_size=8",
            "train.learning_rate=3e-3", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
            "engine.sampling.max_new_tokens=6", f"paths.artifacts={tmp_path}", f"paths.results={tmp_path}/results",
            *extra]


@pytest.fixture(scope="module")
def updated(tiny_model_dir, tmp_path_factory):
    """A worker that played iteration 1 from the starting policy, and the trainer after the
    update on that table, checkpointed (the tests run in order: the second moves the trainer on)."""
    settings = load_settings(run_overrides(tiny_model_dir, tmp_path_factory.mktemp("push")))
    state, worker = start_training(settings), RolloutWorker(settings)
    path, _ = steps.play_shard(worker, 1, None, 0)
    table = steps.score(settings, [read_trajectories(path)], 1)
    saved = steps.save(state, steps.update(state, table, 1))
    probe = state.probe(table)
    yield {"settings": settings, "state": state, "worker": worker, "saved": saved, "table": table, "probe": probe}
    worker.close()
    state.close()


def test_weights_taken_through_memory_are_the_checkpoint_s_and_play_its_table(updated, monkeypatch):
    state, worker, saved, probe = updated["state"], updated["worker"], updated["saved"], updated["probe"]
    expected = probe_logprobs(state.policy, probe)
    stale = weight_sync.largest_gap(probe_logprobs(worker._policy, probe), expected)[0]
    assert stale > 1e-2, f"the update moved the probe's log-probs by {stale:.1e} only"

    # several chunks, as a large model's weights cross
    chunks = list(weight_sync.encoded(state.policy.model.state_dict().items(), chunk_bytes=1 << 12))
    assert len(chunks) > 1
    taken = worker.take_weights(str(saved.path), ckpt.weights_id(saved), iter(chunks), probe, expected)
    assert taken["gap"] <= 1e-6  # the same network in the same process: the same numbers

    # it holds the checkpoint's weights, bit for bit, and asking for the checkpoint reads nothing
    on_disk = load_file(saved.path / "model.safetensors")
    held = worker._policy.model.state_dict()
    assert all(torch.equal(held[name], tensor) for name, tensor in on_disk.items())
    monkeypatch.setattr(ckpt, "load_weights", lambda *a: pytest.fail("the checkpoint was read back"))
    path, _ = steps.play_shard(worker, 2, saved.path, 0)
    assert (worker.loads, worker.pushes) == (0, 1)
    monkeypatch.undo()

    # a second worker that reads the checkpoint from disk plays the same table
    reader = RolloutWorker(updated["settings"])
    try:
        reader.sample_from(None)
        reference, _ = steps.play_shard(reader, 2, saved.path, 0)
        assert reader.loads == 1
        assert read_trajectories(path).drop("run_id", strict=False).equals(
            read_trajectories(reference).drop("run_id", strict=False))
    finally:
        reader.close()


def test_weights_that_do_not_match_the_trainer_s_stop_the_run_and_are_not_trusted(updated):
    state, worker, saved, probe = updated["state"], updated["worker"], updated["saved"], updated["probe"]
    before = list(weight_sync.encoded(state.policy.model.state_dict().items()))
    steps.update(state, updated["table"], 2)  # the trainer moves on; the old weights are sent
    pushes, loads = worker.pushes, worker.loads
    with pytest.raises(weight_sync.StaleWeightsError, match="pushed through memory"):
        worker.take_weights(str(saved.path), ckpt.weights_id(saved), iter(before), probe,
                            probe_logprobs(state.policy, probe))
    assert worker.pushes == pushes
    worker.sample_from(saved.path)  # nothing is held: the checkpoint is read
    assert worker.loads == loads + 1


def test_a_worker_without_an_engine_takes_nothing(tiny_model_dir, tmp_path):
    worker = RolloutWorker(load_settings(run_overrides(tiny_model_dir, tmp_path)))
    assert worker.take_weights("unused", "unused", iter(()), weight_sync.Probe(((1, 2),), (1,)), [[0.0]]) == {}


def test_weights_pushed_before_their_checkpoint_is_written_are_played_and_a_worker_that_missed_them_waits(
        tiny_model_dir, tmp_path):
    """``train.write_behind`` with Ray's rollout workers: the checkpoint's files are written while
    the next rollout plays. A worker pushed its weights plays without them; one that missed the
    push (restarted) waits for the files, then plays the same table from them."""
    import threading

    from mage.run.layout import RunLayout

    settings = load_settings(run_overrides(tiny_model_dir, tmp_path))
    state, worker, reader = start_training(settings), RolloutWorker(settings), RolloutWorker(settings)
    try:
        path, _ = steps.play_shard(worker, 1, None, 0)
        reader.sample_from(None)
        table = steps.score(settings, [read_trajectories(path)], 1)
        steps.update(state, table, 1)
        saved, write = ckpt.checkpoint_writer(RunLayout.of(settings).checkpoints, 1, state.policy,
                                              state.trainer.optimizer, config_hash="test", parent=None, metrics={})
        weights = ckpt.weights_id(saved)
        probe = state.probe(table)
        worker.take_weights(str(saved.path), weights, weight_sync.encoded(state.policy.model.state_dict().items()),
                            probe, probe_logprobs(state.policy, probe))
        pushed, _ = steps.play_shard(worker, 2, saved.path, 0, weights)
        assert not saved.path.exists() and (worker.loads, worker.pushes) == (0, 1)
        pushed_table = read_trajectories(pushed)  # the shard's file is the reader's next

        played: dict = {}
        waiting = threading.Thread(target=lambda: played.update(
            path=steps.play_shard(reader, 2, saved.path, 0, weights)[0]))
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive() and reader.loads == 0  # no files yet: it waits
        written = write()
        waiting.join(timeout=120)
        assert not waiting.is_alive() and reader.loads == 1
        assert ckpt.weights_id(written) == weights  # the id drawn when asked for is the written one's
        assert read_trajectories(played["path"]).drop("run_id", strict=False).equals(
            pushed_table.drop("run_id", strict=False))
        with pytest.raises(TimeoutError, match="written behind"):  # other weights at that path are not these
            ckpt.wait_until_written(saved.path, "another checkpoint's id", timeout=0.5)
    finally:
        reader.close()
        worker.close()
        state.close()
