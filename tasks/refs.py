"""File references: how large results (tables, checkpoints, models) travel between tasks.

A task returns a :class:`FileRef` (a path plus the SHA-256 of the content) instead of the
object itself, so Prefect persists a few hundred bytes of JSON, never a pickled table or
model. A reference is checked before use: if the file was deleted or changed since the
task wrote it (a ``dvc checkout``, a cleaned artifacts folder), :meth:`FileRef.resolve`
raises :class:`StaleReferenceError` and the cache policy (``tasks.caching``) stops reusing
the result that holds it. A checkpoint's hash is its manifest's (hashed once, when it was
written), and checking it reads the manifest and the files' sizes: a change that keeps a
file's size is found when the file is loaded (:mod:`mage.models.checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from mage import io
from mage.models import checkpoint as ckpt

Kind = Literal["file", "checkpoint", "directory"]


class StaleReferenceError(FileNotFoundError):
    """A referenced file is missing or its content changed since it was written."""


def directory_sha256(path: Path) -> str:
    """Hash of every file's relative path and content (a model directory)."""
    files = {str(p.relative_to(path)): io.file_sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def content_hash(path: Path, kind: Kind) -> str | None:
    """The current content hash of ``path``, or None if it is missing or incomplete."""
    if kind == "file":
        return io.file_sha256(path) if path.is_file() else None
    if kind == "checkpoint":
        return ckpt.content_hash(path) if path.is_dir() and ckpt.is_complete(path) else None
    return directory_sha256(path) if path.is_dir() else None


class FileRef(BaseModel):
    """A file or directory a task wrote, pinned by its content hash."""

    model_config = ConfigDict(frozen=True)

    path: str
    sha256: str
    kind: Kind = "file"

    @classmethod
    def of(cls, path: str | Path, kind: Kind = "file") -> FileRef:
        if kind == "checkpoint" and (Path(path) / ckpt.MANIFEST).is_file():
            # one pass over its files: a damaged checkpoint is a CorruptFileError naming the file
            ckpt.require_complete(path)
            return cls(path=str(path), sha256=ckpt.content_hash(path), kind=kind)
        digest = content_hash(Path(path), kind)
        if digest is None:
            raise FileNotFoundError(f"cannot reference {path}: it does not exist (or is an incomplete {kind})")
        return cls(path=str(path), sha256=digest, kind=kind)

    def is_valid(self) -> bool:
        return content_hash(Path(self.path), self.kind) == self.sha256

    def resolve(self) -> Path:
        """The path, after checking that its content is still what the task wrote."""
        if not self.is_valid():
            raise StaleReferenceError(
                f"{self.kind} {self.path} is missing or changed since it was written (sha256 {self.sha256[:12]}); "
                "the task that wrote it will run again on the next flow run"
            )
        return Path(self.path)


def references(value: Any) -> list[FileRef]:
    """Every FileRef inside a task result (nested in dicts, lists, tuples or models)."""
    if isinstance(value, FileRef):
        return [value]
    if isinstance(value, BaseModel):
        return references(dict(value))
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in references(item)]
    if isinstance(value, (list, tuple)):
        return [ref for item in value for ref in references(item)]
    return []
