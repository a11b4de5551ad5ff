"""Where a run will write, and what it will load, checked before any work (a Prefect server, a
preset's build, a flow run): each problem is one :class:`~mage.settings.SettingsError` naming
the key, so a bad ``paths.artifacts`` fails in a second, not after minutes of work.

* ``paths.*`` folders (and the folders of ``paths.*`` files, and ``model.local_dir``, and
  ``model.path`` where the model is built here) must be writable folders, or folders that can
  be made: the nearest part that exists must be a folder this process may write in, on a
  file system mounted for writing. A regular file where a folder belongs, a read-only mount or
  a folder without write permission is named.
* ``model.path`` of a model loaded as is (``model.build: null``) is a model folder (it holds
  ``config.json``) or a hub id (``org/name``); anything else is named before a download or a
  load is tried.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from mage.settings import Settings, SettingsError

#: A Hugging Face hub id: ``org/name`` (letters, digits, ``.``, ``_``, ``-``).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
#: ``paths`` keys that name a file (the others name folders).
FILE_KEYS = ("population_manifest", "metrics")


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a folder this process writes in (None: it can, or can be made)."""
    found = _nearest_existing(path)
    if not found.is_dir():
        if found != path:
            return f"{path} cannot be made: {found} is {'a file' if found.is_file() else 'not a folder'}"
        return f"{path} is a file, not a folder" if found.is_file() else f"{path} is not a folder"
    try:
        read_only = bool(os.statvfs(found).f_flag & os.ST_RDONLY)
    except OSError as error:
        return f"{path}: cannot read {found}: {error.strerror}"
    if read_only:
        return f"{path} is on a read-only file system ({found})"
    if not os.access(found, os.W_OK | os.X_OK):
        return f"{path}: no permission to write in {found}"
    return None


def check_paths(settings: Settings) -> None:
    """Raise :class:`SettingsError` naming the first key whose path cannot be used (see the module)."""
    checks: list[tuple[str, Path]] = []
    for field in dataclasses.fields(settings.paths):
        key, value = field.name, getattr(settings.paths, field.name)
        if value is None:
            continue
        checks.append((f"paths.{key}", Path(value).parent if key in FILE_KEYS else Path(value)))
        if key in FILE_KEYS and Path(value).is_dir():
            raise SettingsError(f"paths.{key}: {value} is a folder, not a file")
    model = settings.model
    if model.local_dir is not None:
        checks.append(("model.local_dir", Path(model.local_dir)))
    if model.build is not None:
        checks.append(("model.path", Path(model.path)))
    for key, path in checks:
        problem = folder_problem(path)
        if problem:
            raise SettingsError(f"{key}: {problem}")
    if model.build is None:
        path = Path(model.path)
        if path.exists():
            if not (path / "config.json").is_file():
                raise SettingsError(f"model.path: {model.path} is not a model folder (no config.json in it)")
        elif not HUB_ID.fullmatch(model.path):
            raise SettingsError(f"model.path: {model.path} is neither a model folder nor a hub id (org/name)")
