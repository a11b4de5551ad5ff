"""Checkpoints at scale: hashed once when written, sizes checked on listing, hashes checked
only on what is loaded; pruning spares the final checkpoint and any an evaluation holds; a
LoRA checkpoint is the adapter alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import algo_config, train_config

from mage import io
from mage.config.sections import LoraSection
from mage.models import checkpoint as ckpt
from mage.models.policy import load_policy
from mage.trainer.policy_trainer import PolicyTrainer

LORA = LoraSection(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"))


def saved(tiny_model_dir, root, iterations, lora=None):
    policy = load_policy(tiny_model_dir, lora=lora)
    trainer = PolicyTrainer(policy, train_config(), algo_config())
    return policy, trainer, [ckpt.save_checkpoint(root, i, policy, trainer.optimizer, config_hash="h", parent=None,
                                                  metrics={}) for i in iterations]


@pytest.fixture
def hashes(monkeypatch):
    """The files hashed from here on (mage.io's memo cleared, so each hash is a real read)."""
    io._sha256_of.cache_clear()
    seen = []
    real = io._sha256_of.__wrapped__

    def counted(path, size, mtime_ns):
        seen.append(os.path.basename(path))
        return real(path, size, mtime_ns)

    monkeypatch.setattr(io, "_sha256_of", counted)
    return seen


def test_listing_and_resuming_trust_the_manifest_and_loading_hashes_only_what_it_loads(tiny_model_dir, tmp_path, hashes):
    policy, trainer, (first, second) = saved(tiny_model_dir, tmp_path, [1, 2])
    manifest = second.manifest
    assert manifest["sizes"] == {p.name: p.stat().st_size for p in second.path.iterdir() if p.name != ckpt.MANIFEST}
    hashes.clear()
    assert [c.iteration for c in ckpt.list_checkpoints(tmp_path)] == [1, 2]
    assert ckpt.latest_checkpoint(tmp_path).path == second.path and hashes == []
    ckpt.load_weights(policy, second)
    assert sorted(hashes) == sorted(ckpt.weight_files(second.path)) and ckpt.STATE_FILE not in hashes
    hashes.clear()
    ckpt.load_trainer_state(second, trainer.optimizer)
    assert hashes == [ckpt.STATE_FILE]


def test_a_same_size_corruption_is_named_when_its_file_is_loaded(tiny_model_dir, tmp_path):
    policy, trainer, (first, second) = saved(tiny_model_dir, tmp_path, [1, 2])
    weights = second.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last tensor: same size, other content
    weights.write_bytes(bytes(data))
    assert ckpt.latest_checkpoint(tmp_path).path == second.path  # sizes match: listing trusts it
    with pytest.raises(io.CorruptFileError, match=rf"^{weights}: does not match the checkpoint's manifest"):
        ckpt.load_weights(policy, second)
    with pytest.raises(io.CorruptFileError, match=rf"^{weights}: does not match"):
        ckpt.require_complete(second.path)
    state = second.path / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[:-1])  # shorter: listing skips the checkpoint
    assert ckpt.latest_checkpoint(tmp_path).path == first.path


def test_pruning_spares_the_final_checkpoint_and_held_ones(tiny_model_dir, tmp_path):
    _, _, checkpoints = saved(tiny_model_dir, tmp_path, [1, 2, 3, 4, 5, 6])
    path = {c.iteration: c.path for c in checkpoints}
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    stale = tmp_path / ckpt.HOLDS / f"{path[3].name}.{socket.gethostname()}.{int(gone.stdout)}.0a1b2c3d"
    stale.parent.mkdir()
    stale.touch()  # a hold of a process that has ended holds nothing
    elsewhere = tmp_path / ckpt.HOLDS / f"{path[4].name}.another.host.example.1.0a1b2c3d"
    elsewhere.touch()  # another machine's hold is trusted
    with ckpt.held(path[2]), ckpt.held(path[2]):  # two holders in one process, one file each
        assert len(list((tmp_path / ckpt.HOLDS).glob(f"{path[2].name}.*"))) == 2
        ckpt.prune_checkpoints(tmp_path, keep=2, up_to=6, protect=[path[1]])
        assert [c.iteration for c in ckpt.list_checkpoints(tmp_path)] == [1, 2, 4, 5, 6]
    assert [p.name for p in (tmp_path / ckpt.HOLDS).iterdir()] == [elsewhere.name]  # the stale and our own are gone
    ckpt.prune_checkpoints(tmp_path, keep=2, up_to=6, protect=[path[1]])
    assert [c.iteration for c in ckpt.list_checkpoints(tmp_path)] == [1, 4, 5, 6]


def test_a_lora_checkpoint_is_the_adapter_and_its_optimizer_state_alone(tiny_model_dir, tmp_path):
    policy, trainer, (checkpoint,) = saved(tiny_model_dir, tmp_path, [1], lora=LORA)
    files = {p.name for p in checkpoint.path.iterdir()}
    assert "adapter_model.safetensors" in files and not any(name.startswith("model") for name in files)
    from safetensors.torch import load_file

    adapter = load_file(checkpoint.path / "adapter_model.safetensors")
    trained = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    assert sum(t.numel() for t in adapter.values()) == trained
    assert all(t.dtype == torch.float32 for t in adapter.values())
    base = sum(p.numel() for p in policy.model.parameters())
    assert trained < base / 10  # the adapter alone, not the base model's weights


def test_an_evaluation_holds_the_checkpoint_it_plays(tiny_model_dir, tmp_path, monkeypatch):
    import mage.evaluation.play as evaluation

    policy, trainer, (checkpoint, _) = saved(tiny_model_dir, tmp_path, [1, 2])
    holds = tmp_path / ckpt.HOLDS
    seen = []

    def playing(settings, played, splits, progress=True):
        seen.extend(p.name for p in holds.iterdir())
        ckpt.prune_checkpoints(tmp_path, keep=1, up_to=None)  # a run saving its next checkpoint meanwhile
        raise RuntimeError("stopped while playing")

    monkeypatch.setattr(evaluation, "evaluate_checkpoint", playing)
    with pytest.raises(RuntimeError, match="stopped while playing"):
        evaluation.write_evaluation(None, checkpoint, "train", tmp_path / "out")
    assert len(seen) == 1 and seen[0].startswith(f"{checkpoint.path.name}.")
    assert checkpoint.path.is_dir() and not holds.exists()  # kept while held; no hold, nor its folder, after


def test_a_checkpoint_takes_the_workers_sharded_state_and_lists_its_files(tiny_model_dir, tmp_path, hashes):
    """train.workers > 1: the workers' state folder is moved into the checkpoint as
    ``trainer_state/``; the manifest hashes and sizes its files by their relative paths, a
    damaged one makes the checkpoint incomplete, and loading the weights reads none of them."""
    policy = load_policy(tiny_model_dir)
    trainer = PolicyTrainer(policy, train_config(), algo_config())
    staging = tmp_path / ".update-00001" / "trainer_state"
    staging.mkdir(parents=True)
    (staging / "shard-00001-model-00001-of-00001.safetensors").write_bytes(b"rank 0's shards")
    (staging / "shard-00002-model-00001-of-00001.safetensors").write_bytes(b"rank 1's shards")
    saved = ckpt.save_checkpoint(tmp_path / "checkpoints", 1, policy, trainer.optimizer, config_hash="h", parent=None,
                                 metrics={}, sharded_state=staging)
    assert saved.sharded and staging.exists()  # linked, so a failed save can be retried; mage.run.steps.save removes it
    names = {f"trainer_state/shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2)}
    assert names <= set(saved.manifest["files"]) and saved.manifest["sizes"][min(names)] == len(b"rank 0's shards")
    assert not names & set(ckpt.weight_files(saved.path))
    from safetensors.torch import load_file

    assert not [k for k in load_file(saved.path / ckpt.STATE_FILE) if k.startswith("optimizer.")]  # the RNG alone
    hashes.clear()
    ckpt.load_weights(policy, saved)
    assert not [h for h in hashes if h.startswith("shard-")]
    (saved.path / min(names)).write_bytes(b"torn")
    assert not ckpt.is_complete(saved.path)
