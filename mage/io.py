"""Atomic artifact writes: write a temporary file beside the target, then rename.

A reader (or a resumed run) never sees a half-written file: ``os.replace`` is atomic on
POSIX file systems when source and target are in the same directory.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's content, memoised per (path, size, mtime): re-checking a
    multi-GB model or checkpoint on every cache lookup would cost seconds, and a rewritten
    file has a new mtime."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: What the operating system says when a write cannot be done, and what to do about it.
STORAGE_REMEDIES = {
    errno.ENOSPC: "free space on that file system (`df -h`) or set paths.artifacts to another one",
    errno.EDQUOT: "free space within your disk quota or set paths.artifacts to another file system",
    errno.EACCES: "give this user write permission there or set paths.artifacts to a folder it may write in",
    errno.EPERM: "give this user write permission there or set paths.artifacts to a folder it may write in",
    errno.EROFS: "set paths.artifacts to a file system mounted for writing",
}
#: How libraries that do not raise ``OSError`` (safetensors' writer) word the same errors.
_STORAGE_WORDS = {os.strerror(code): code for code in STORAGE_REMEDIES}


class StorageError(RuntimeError):
    """A write the file system refused (no space, no permission, read-only). One line: the
    file, what happened and what to do; nothing half-written stays (writes here are atomic), so
    the same command, run again once it is fixed, goes on from what was saved."""

    def __init__(self, path: str | os.PathLike, code: int) -> None:
        super().__init__(f"{path}: {os.strerror(code)} while writing it; {STORAGE_REMEDIES[code]}, then run the "
                         "same command again (nothing half-written is kept)")
        self.path, self.errno = Path(path), code

    transient = False  # tasks.caching.is_transient: trying again at once meets the same file system


def storage_error(path: str | os.PathLike, error: BaseException) -> StorageError | None:
    """``error`` as a :class:`StorageError` about ``path``, where it is one of
    :data:`STORAGE_REMEDIES`' (as an ``OSError`` or in another library's words); else None."""
    if isinstance(error, StorageError):
        return error
    code = getattr(error, "errno", None)
    if isinstance(error, OSError) and code in STORAGE_REMEDIES:
        return StorageError(getattr(error, "filename", None) or path, code)
    text = str(error)
    for words, found in _STORAGE_WORDS.items():
        if words in text:
            return StorageError(path, found)
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Inside, a refused write (:func:`storage_error`) raises a :class:`StorageError` about ``path``."""
    try:
        yield
    except Exception as error:
        refused = storage_error(path, error)
        if refused is None or refused is error:
            raise
        raise refused from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically. A
    write the file system refuses is a :class:`StorageError` naming ``path``."""
    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            yield Path(tmp)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp_path)`` and move the result to ``path`` atomically."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """JSON with sorted keys and a final newline, so equal data gives equal bytes."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


#: What to do about a damaged artifact, unless the reader knows better.
REMEDY = "delete it and re-run the step that writes it, or restore it with `dvc pull`"


class CorruptFileError(ValueError):
    """A file that cannot be read as what it should be. The message is one line: the file,
    what is wrong with it and what to do."""

    def __init__(self, path: str | os.PathLike, problem: str, remedy: str = REMEDY) -> None:
        super().__init__(f"{path}: {problem}; {remedy}")
        self.path = Path(path)


def read_json(path: str | os.PathLike, remedy: str = REMEDY) -> Any:
    """A JSON file; unreadable JSON is a :class:`CorruptFileError` naming the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise CorruptFileError(path, f"not valid JSON ({error.msg} at line {error.lineno})", remedy) from None
    except UnicodeDecodeError:
        raise CorruptFileError(path, "not valid JSON (not UTF-8 text)", remedy) from None


def read_json_lines(path: str | os.PathLike, remedy: str = REMEDY) -> list[dict[str, Any]]:
    """A JSON-lines file's records ([] where there is no file; blank lines are skipped); a
    line that is not a JSON object is a :class:`CorruptFileError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: JSON text may hold U+2028
    except UnicodeDecodeError:
        raise CorruptFileError(path, "not valid JSON lines (not UTF-8 text)", remedy) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorruptFileError(path, f"line {number} is not valid JSON ({error.msg})", remedy) from None
        if not isinstance(record, dict):
            raise CorruptFileError(path, f"line {number} is not a JSON object", remedy)
        records.append(record)
    return records


def replace_directory(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Build a directory with ``write(tmp_dir)`` (tmp_dir does not exist yet) and move it
    to ``path`` in one rename; an existing ``path`` is replaced."""
    import shutil

    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        tmp.rmdir()
        try:
            write(tmp)
            if target.exists():
                old = target.with_name(f".{target.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                os.rename(target, old)
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


#: The hidden temporaries of this module and of checkpoint writes: ``.<name>.<8 random
#: characters>[.tmp]`` (mkstemp, mkdtemp) and ``.<name>.old`` (a directory being replaced).
STALE_TEMPORARY = re.compile(r"\..+\.([a-z0-9_]{8}(\.tmp)?|old)")


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporaries a killed writer left under ``directory`` (recursively) and
    return them. Call it only while no other process writes there (under the run's lock)."""
    import shutil

    root = Path(directory)
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(root.rglob(".*")):
        if STALE_TEMPORARY.fullmatch(path.name) and path.exists():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class IncompatibleFilesError(ValueError):
    """Files that are each whole but cannot be used together (evaluation tables of two
    policies in one report, say). The message names them and what to do."""


class RunLockedError(RuntimeError):
    """Another process holds the run's lock."""


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, what: str, wait: bool = False) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed): wait for it, or raise
    :class:`RunLockedError` at once when another process holds it. The kernel releases it
    when the holder exits, however it exits, so a killed run never leaves a stale lock."""
    import fcntl

    lock = Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunLockedError(f"{what} is in use by {holder} (lock {lock}); wait for it to finish or choose "
                                 f"another run.name") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield lock
    finally:
        handle.close()
