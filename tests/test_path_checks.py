"""Paths checked before any work (mage/preflight/paths.py): each bad ``paths.*`` or ``model.path``
is one line naming the key, from the library and from ``python -m flows`` in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tmpfs_at

from mage.preflight.paths import check_paths
from mage.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parent.parent


def settings_with(*overrides: str):
    return load_settings(list(overrides))


def test_writable_folders_and_folders_that_can_be_made_pass(tmp_path, tiny_model_dir):
    check_paths(settings_with(f"paths.artifacts={tmp_path / 'new' / 'deeper'}"))  # made later, by the run
    check_paths(settings_with(f"paths.artifacts={tmp_path}", f"model.path={tiny_model_dir}", "model.build=null"))
    check_paths(settings_with(f"paths.artifacts={tmp_path}", "model=qwen3_4b"))  # a hub id


def test_a_file_where_a_folder_belongs_is_named(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(SettingsError, match=f"^paths.artifacts: {file} is a file, not a folder$"):
        check_paths(settings_with(f"paths.artifacts={file}"))
    with pytest.raises(SettingsError, match=f"^paths.artifacts: {file}/under cannot be made: {file} is a file"):
        check_paths(settings_with(f"paths.artifacts={file}/under"))
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(SettingsError, match=f"^paths.metrics: {folder} is a folder, not a file$"):
        check_paths(settings_with(f"paths.artifacts={tmp_path}", f"paths.metrics={folder}"))


def test_a_read_only_file_system_and_a_folder_without_permission_are_named(tmp_path, monkeypatch):
    real = os.statvfs

    class ReadOnly:
        def __init__(self, found):
            self.f_flag = real(found).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    with pytest.raises(SettingsError, match=f"^paths.artifacts: {tmp_path}/run is on a read-only file system"):
        check_paths(settings_with(f"paths.artifacts={tmp_path}/run"))
    monkeypatch.setattr(os, "statvfs", real)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere: the check is os.access's
    with pytest.raises(SettingsError, match=f"^paths.artifacts: {tmp_path}/run: no permission to write in {tmp_path}$"):
        check_paths(settings_with(f"paths.artifacts={tmp_path}/run"))


def test_a_real_read_only_mount_is_named(tmp_path):
    """A read-only tmpfs, where this machine lets the tests mount one (root in a container)."""
    mount = tmp_path / "ro"
    with tmpfs_at(mount, "ro,size=1m"), pytest.raises(SettingsError, match=f"^paths.artifacts: {mount}/run is on a "
                                                                            "read-only file system"):
        check_paths(settings_with(f"paths.artifacts={mount}/run"))


def test_a_model_path_that_is_neither_a_model_folder_nor_a_hub_id_is_named(tmp_path):
    with pytest.raises(SettingsError, match=r"^model.path: /no/such/model is neither a model folder nor a hub id"):
        check_paths(settings_with(f"paths.artifacts={tmp_path}", "model.path=/no/such/model", "model.build=null"))
    with pytest.raises(SettingsError, match=f"^model.path: {tmp_path} is not a model folder \\(no config.json"):
        check_paths(settings_with(f"paths.artifacts={tmp_path}", f"model.path={tmp_path}", "model.build=null"))


@pytest.mark.e2e
def test_the_command_line_fails_in_seconds_with_one_line(tmp_path):
    """The default model.path (the tiny preset's build, minutes of work) with a regular file as
    paths.artifacts: one line naming the key, before a Prefect server or the build starts."""
    file = tmp_path / "artifacts"
    file.write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "flows", "train", f"paths.artifacts={file}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    # the only line: no server started, no build began (each logs)
    assert done.stderr.strip().splitlines() == [f"config error: paths.artifacts: {file} is a file, not a folder"]
    assert not done.stdout.strip()
