"""A write the file system refuses (no space, no permission, read-only) is one line: the file,
what happened, what to do (mage.io.StorageError), at every atomic write and at the checkpoint
write, and nothing half-written is left to be trusted on the next run."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import polars as pl
import pytest
from conftest import tmpfs_at

from mage import io
from mage.io import StorageError


def refusing(code: int):
    def write(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return write


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT])
def test_every_atomic_write_names_the_file_and_leaves_nothing(tmp_path, monkeypatch, code):
    target = tmp_path / "out" / "data.json"
    writers = {
        "write_json": lambda: io.write_json(target, {"a": 1}),
        "write_text": lambda: io.write_text(target, "x"),
        "atomic_write": lambda: io.atomic_write(target, lambda tmp: tmp.write_bytes(b"x")),
        "replace_directory": lambda: io.replace_directory(target, lambda tmp: (tmp.mkdir(), (tmp / "f").write_text("x"))),
    }
    monkeypatch.setattr(Path, "write_text", refusing(code))
    monkeypatch.setattr(Path, "write_bytes", refusing(code))
    for name, write in writers.items():
        with pytest.raises(StorageError) as raised:
            write()
        message = str(raised.value)
        assert message.startswith(f"{target}: {os.strerror(code)} while writing it; "), (name, message)
        assert "\n" not in message and io.STORAGE_REMEDIES[code] in message
        assert not target.exists() and not [p for p in target.parent.iterdir()], name  # no temporary left
    monkeypatch.undo()
    # a parquet table (polars' own writer, as mage.rollout.schema.write_trajectories calls it)
    monkeypatch.setattr(pl.DataFrame, "write_parquet", refusing(code))
    table = pl.DataFrame({"a": [1]})
    with pytest.raises(StorageError, match=f"^{tmp_path}/t.parquet: {os.strerror(code)}"):
        io.atomic_write(tmp_path / "t.parquet", lambda tmp: table.write_parquet(tmp, compression="zstd"))


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ZeroDivisionError):
        io.atomic_write(tmp_path / "x", lambda tmp: 1 / 0)
    with pytest.raises(OSError) as raised:
        io.atomic_write(tmp_path / "x", refusing(errno.EIO))
    assert not isinstance(raised.value, StorageError)


def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_no_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """safetensors reports a full disk in its own words (a SafetensorError, not an OSError)."""
    from conftest import algo_config, train_config
    from safetensors import SafetensorError

    from mage.models import checkpoint as ckpt
    from mage.models.policy import load_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    policy = load_policy(str(tiny_model_dir), dtype="float32", device="cpu")
    trainer = PolicyTrainer(policy, train_config(), algo_config())
    saved = ckpt.save_checkpoint(tmp_path, 1, policy, trainer.optimizer, config_hash="h", parent=None, metrics={})

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                              "message: \"No space left on device\" })")

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(StorageError, match=f"^{tmp_path}/ckpt-00002: No space left on device while writing it; "):
        ckpt.save_checkpoint(tmp_path, 2, policy, trainer.optimizer, config_hash="h", parent=saved.path.name,
                             metrics={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00001"]  # nothing half-written beside it
    assert ckpt.latest_checkpoint(tmp_path).iteration == 1


def test_a_real_full_disk_is_a_storage_error_and_leaves_nothing(tmp_path):
    """A 4 KiB tmpfs (where the machine lets the tests mount one): the file system's own ENOSPC."""
    with tmpfs_at(tmp_path / "full", "size=4k") as mount:
        with pytest.raises(StorageError, match=f"^{mount}/population.json: No space left on device while writing it; "):
            io.write_json(mount / "population.json", {"opponents": "x" * 20_000})
        assert list(mount.iterdir()) == []  # the temporary went with the failure
