"""Checkpoints: safetensors plus a JSON manifest, written atomically.

A checkpoint is a directory ``ckpt-00007/`` holding

* the weights: ``adapter_model.safetensors`` + ``adapter_config.json`` (LoRA, via peft) or
  ``model.safetensors`` + config + tokenizer (full fine-tuning), loadable with
  ``from_pretrained`` (and servable by vLLM);
* ``trainer_state.safetensors``: the AdamW moments and step counts, and the torch RNG
  state(s), as tensors (nothing is pickled); with ``train.workers`` > 1 the moments (and the
  trained weights) are instead in ``trainer_state/``, sharded by the workers that wrote them
  (:mod:`mage.trainer.sharded`: safetensors files any number of workers reads back), and this
  file holds the RNG states alone;
* ``manifest.json``: iteration, config hash, parent checkpoint, metrics, the optimizer's
  hyper-parameters, the Python RNG state and the SHA-256 and size of every file.

It is written into a temporary directory beside the final one and renamed into place, so
a directory named ``ckpt-*`` is always complete. Its files are hashed once, as they are
written; after that the manifest is trusted. Listing and resuming check that every file is
there at its size (:func:`latest_checkpoint` returns the newest such one); a file is hashed
again only when it is loaded (:func:`load_weights`, :func:`load_trainer_state`,
:func:`require_complete`): at a Qwen3-4B scale a checkpoint is gigabytes, and hashing every
kept one at every listing would cost minutes.

A checkpoint that an evaluation is playing is held (:func:`held`): pruning leaves it, and
the run's final checkpoint, whatever ``train.keep_checkpoints`` says.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mage import __version__, io

PREFIX = "ckpt-"
#: The workers' sharded state, inside an update's output and a checkpoint (mage.trainer.sharded)
SHARDED_STATE = "trainer_state"
MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.safetensors"
#: Beside the checkpoints: one empty file per evaluation holding one (``ckpt-00007.<host>.<pid>.<id>``).
HOLDS = ".holds"
#: What to do about a damaged checkpoint: the run resumes from the one before it.
DAMAGED = "delete this checkpoint directory and re-run: training resumes from the checkpoint before it"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: dict[str, Any]

    @property
    def iteration(self) -> int:
        return int(self.manifest["iteration"])

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def sharded(self) -> bool:
        """Whether the optimizer state is the workers' sharded one (``trainer_state/``)."""
        return bool(self.manifest.get("sharded_state"))

    @classmethod
    def at(cls, path: str | Path) -> Checkpoint:
        """The checkpoint in directory ``path`` (its manifest read; completeness is the caller's check)."""
        path = Path(path)
        return cls(path, io.read_json(path / MANIFEST, DAMAGED))


def content_hash(path: str | Path) -> str:
    """Hash of a checkpoint's weights (from its manifest): what caches key on."""
    return _files_hash(io.read_json(Path(path) / MANIFEST, DAMAGED))


def _files_hash(manifest: dict[str, Any]) -> str:
    weights = {k: v for k, v in manifest["files"].items() if k != STATE_FILE}
    return hashlib.sha256(json.dumps(weights, sort_keys=True).encode()).hexdigest()


def weights_id(checkpoint: Checkpoint) -> str:
    """What names a checkpoint's weights where a process holds them (a rollout worker): the
    manifest's ``id``, drawn when the checkpoint is asked for, so that weights pushed through
    memory are named before a checkpoint written behind has its files; for a checkpoint written
    before ids, the hash of its weight files (:func:`content_hash`)."""
    return checkpoint.manifest.get("id") or _files_hash(checkpoint.manifest)


#: How long a reader in another process waits for a checkpoint being written behind (a
#: Qwen3-4B checkpoint with its optimizer state is about 45 GiB).
WRITE_WAIT_SECONDS = 1800.0


class UnwrittenCheckpoint(TimeoutError):
    """A checkpoint asked for by another process was not written (its write failed, or took
    longer than :data:`WRITE_WAIT_SECONDS`)."""

    transient = False  # tasks.caching.is_transient: the trainer's process has given up on it


def _unwritten_marker(path: Path) -> Path:
    return path.parent / f".{path.name}.unwritten"


def mark_unwritten(checkpoint: Checkpoint) -> None:
    """Say beside checkpoint ``checkpoint`` that its write behind failed for good (its id in a
    small file), so that a reader waiting for it (:func:`wait_until_written`) stops at once.
    Best effort: the disk that refused the checkpoint may refuse this too."""
    with contextlib.suppress(OSError):
        checkpoint.path.parent.mkdir(parents=True, exist_ok=True)
        _unwritten_marker(checkpoint.path).write_text(weights_id(checkpoint))


def wait_until_written(path: str | Path, weights: str | None = None,
                       timeout: float = WRITE_WAIT_SECONDS) -> Checkpoint:
    """Checkpoint ``path`` once it is complete on disk and, given ``weights``, holds those
    (:func:`weights_id`): the trainer's process may still be writing it behind
    (``train.write_behind``), and renames it into place whole when written (an older checkpoint
    at that path, damaged or not, is being replaced). :class:`UnwrittenCheckpoint` at once if
    the trainer's process marked its write failed (:func:`mark_unwritten`), or after
    ``timeout`` seconds."""
    path = Path(path)
    deadline = time.monotonic() + timeout
    found = "nothing"
    while True:
        try:
            if (path / MANIFEST).is_file():
                _require(path, ())
                checkpoint = Checkpoint.at(path)
                if weights in (None, weights_id(checkpoint)):
                    return checkpoint
                found = f"checkpoint weights {weights_id(checkpoint)}"
        except (io.CorruptFileError, OSError) as error:  # being replaced, or damaged
            found = str(error)
        failed = None
        with contextlib.suppress(OSError):
            failed = _unwritten_marker(path).read_text()
        if weights is not None and failed == weights:
            raise UnwrittenCheckpoint(f"{path}: the trainer's process failed to write this checkpoint (its log "
                                      f"says why); the run resumes from the checkpoint before it")
        if time.monotonic() >= deadline:
            raise UnwrittenCheckpoint(f"{path}: waited {timeout:g} s for checkpoint weights {weights or ''} written "
                                      f"behind by the trainer's process, found {found}; the trainer's log says "
                                      f"whether its write failed")
        time.sleep(0.2)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    state = optimizer.state_dict()
    tensors = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"optimizer.{index}.{name}"] = tensor.detach().cpu().contiguous()
    return tensors


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    return tensors


def save_checkpoint(*args: Any, **kwargs: Any) -> Checkpoint:
    """Write checkpoint ``iteration`` under ``root`` atomically and return it (an older
    checkpoint of the same iteration is replaced whole: :func:`mage.io.replace_directory`);
    the arguments are :func:`checkpoint_writer`'s. ``sharded_state``: the workers' state of
    this update (``train.workers`` > 1), linked in instead of ``optimizer``'s (the caller
    removes it once saved)."""
    _, write = checkpoint_writer(*args, **kwargs)
    return write()


def checkpoint_writer(
    root: str | Path,
    iteration: int,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    *,
    config_hash: str,
    parent: str | None,
    metrics: dict[str, Any],
    sharded_state: Path | None = None,
) -> tuple[Checkpoint, Callable[[], Checkpoint]]:
    """:func:`save_checkpoint` in two parts: the checkpoint, and the function that writes it
    and returns it with its files. What a rollout uses or changes is taken now: the RNG states
    (it draws from them), the tokenizer (it encodes with it) and the generation config (the
    ``hf`` backend swaps it during ``generate``). The weights and the optimizer state are
    written when the function runs, which may be on another thread while a rollout plays,
    before the next update changes them. The checkpoint returned now has the manifest's
    metadata (``iteration``, ``kind``) and no files."""
    final = Path(root) / f"{PREFIX}{iteration:05d}"
    groups = optimizer.state_dict()["param_groups"]
    rng = _rng_tensors()
    manifest: dict[str, Any] = {
        "iteration": iteration,
        "kind": "lora" if policy.is_lora else "full",
        "base_model": policy.source,
        "config_hash": config_hash,
        "parent": parent,
        "metrics": metrics,
        "optimizer": {"type": type(optimizer).__name__, "param_groups": groups},
        "python_rng": _json_rng(random.getstate()),
        "mage_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sharded_state": sharded_state is not None,
        "id": uuid.uuid4().hex,  # names the weights before the files exist (weights_id)
    }
    generation = None if policy.is_lora or not policy.model.can_generate() else \
        copy.deepcopy(policy.model.generation_config)
    tokenizer_files: dict[str, bytes] = {}  # the tokenizer's files, written now and held (a few MB)
    if not policy.is_lora:
        with tempfile.TemporaryDirectory() as staged:
            policy.tokenizer.save_pretrained(staged)
            tokenizer_files = {f.name: f.read_bytes() for f in Path(staged).iterdir() if f.is_file()}

    def write_into(tmp: Path) -> dict[str, Any]:
        policy.model.save_pretrained(tmp, safe_serialization=True)
        if generation is not None:  # as it was when the checkpoint was asked for
            generation.save_pretrained(tmp)
        for name, data in tokenizer_files.items():
            (tmp / name).write_bytes(data)
        if sharded_state is not None:  # the workers' optimizer state, not this process's
            # linked, not moved: a failed write (the whole temporary folder is removed) can be retried
            shutil.copytree(sharded_state, tmp / SHARDED_STATE, copy_function=os.link)
        tensors = {} if sharded_state is not None else _optimizer_tensors(optimizer)
        save_file(tensors | rng, tmp / STATE_FILE)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        written = manifest | {
            "files": {p.relative_to(tmp).as_posix(): io.file_sha256(p) for p in files},
            "sizes": {p.relative_to(tmp).as_posix(): p.stat().st_size for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
        return written

    def write() -> Checkpoint:
        written: dict[str, Any] = {}
        io.replace_directory(final, lambda tmp: written.update(write_into(tmp)))
        _unwritten_marker(final).unlink(missing_ok=True)  # a failed write's before this one
        return Checkpoint(final, written)

    return Checkpoint(final, manifest), write


def _json_rng(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def damaged_files(path: Path, hashed: Iterable[str] = ()) -> list[str]:
    """The files of checkpoint ``path`` that are missing, not at their manifest's size, or
    (for the names in ``hashed``) not at its SHA-256; the manifest itself, when it is missing
    or unreadable. Empty for a complete checkpoint. A manifest from before sizes were
    recorded has every file hashed."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return [MANIFEST]
    try:
        manifest = io.read_json(manifest_path, DAMAGED)
        files, sizes = manifest["files"], manifest.get("sizes")
        hashed = set(files) if sizes is None else set(hashed)
        bad = []
        for name, digest in files.items():
            file = path / name
            if not file.is_file() or (sizes is not None and file.stat().st_size != sizes.get(name)) \
                    or (name in hashed and io.file_sha256(file) != digest):
                bad.append(name)
        return bad
    except (io.CorruptFileError, KeyError, TypeError, AttributeError) as error:
        return [f"{MANIFEST} ({error})"]


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint whose files are all there at their manifest's
    sizes (a damaged one is skipped with a WARNING naming it: a resumed run starts from the
    one before)."""
    if not (path / MANIFEST).is_file():
        return False  # being written, or not a checkpoint
    bad = damaged_files(path)
    if bad:
        logging.getLogger(__name__).warning(f"{path}: skipped, its files do not match its manifest: {bad}; {DAMAGED}")
    return not bad


def _require(path: Path, hashed: Iterable[str]) -> None:
    bad = damaged_files(path, hashed)
    if bad:
        problem = "missing" if bad[0] == MANIFEST else "does not match the checkpoint's manifest"
        raise io.CorruptFileError(path / bad[0].split(" ")[0], problem, DAMAGED)


def weight_files(path: Path) -> list[str]:
    """The files of checkpoint ``path`` that a policy loads: all but the trainer's state."""
    return [name for name in io.read_json(path / MANIFEST, DAMAGED)["files"]
            if name != STATE_FILE and not name.startswith(SHARDED_STATE + "/")]


def require_complete(path: str | Path) -> Path:
    """``path`` if it is a complete checkpoint whose weights match their hashes (what serving
    or evaluating it loads); otherwise a :class:`mage.io.CorruptFileError` naming the first
    damaged file (a checkpoint asked for by name has no stand-in)."""
    path = Path(path)
    _require(path, weight_files(path) if (path / MANIFEST).is_file() else ())
    return path


@contextlib.contextmanager
def held(checkpoint: Path | None) -> Iterator[None]:
    """Hold ``checkpoint`` while the block runs: :func:`prune_checkpoints` leaves it (an
    evaluation of a run that is still training keeps the checkpoint it plays)."""
    if checkpoint is None:
        yield
        return
    holds = Path(checkpoint).parent / HOLDS
    holds.mkdir(parents=True, exist_ok=True)
    # one file per hold: two evaluations of one process each hold the checkpoint
    hold = holds / f"{Path(checkpoint).name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    hold.touch()
    try:
        yield
    finally:
        hold.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            holds.rmdir()  # the last hold leaves no folder behind


def _held_names(root: Path) -> set[str]:
    """The checkpoints under ``root`` that a live process holds (a hold of a process of this
    host that has died is removed; another host's is trusted)."""
    names = set()
    here = socket.gethostname()
    for hold in (root / HOLDS).glob(f"{PREFIX}*") if (root / HOLDS).is_dir() else ():
        name, _, rest = hold.name.partition(".")
        host, _, pid = rest.rsplit(".", 1)[0].rpartition(".")
        if host == here and pid.isdigit() and not _alive(int(pid)):
            hold.unlink(missing_ok=True)
            continue
        names.add(name)
    return names


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.glob(f"{PREFIX}*")):
        if path.is_dir() and is_complete(path):
            found.append(Checkpoint.at(path))
    return sorted(found, key=lambda c: c.iteration)


def latest_checkpoint(root: str | Path, at_most: int | None = None) -> Checkpoint | None:
    """The newest complete checkpoint under ``root`` (of iteration ``at_most`` or before)."""
    checkpoints = [c for c in list_checkpoints(root) if at_most is None or c.iteration <= at_most]
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(root: str | Path, keep: int | None, up_to: int | None = None,
                      protect: Iterable[Path] = ()) -> None:
    """Keep the newest ``keep`` complete checkpoints (None: all) of those of iteration ``up_to``
    or before; later ones are left as they are, and so are those in ``protect`` (the run's
    final checkpoint) and those an evaluation holds (:func:`held`)."""
    if keep is None:
        return
    root = Path(root)
    protected = {Path(p).name for p in protect}
    for checkpoint in [c for c in list_checkpoints(root) if up_to is None or c.iteration <= up_to][:-keep]:
        # the holds are read again for each: an evaluation may have taken one meanwhile
        if checkpoint.path.name not in protected | _held_names(root):
            shutil.rmtree(checkpoint.path, ignore_errors=True)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; a damaged one is a :class:`mage.io.CorruptFileError` naming it."""
    try:
        return load_file(path)
    except SafetensorError as error:
        raise io.CorruptFileError(path, f"not a readable safetensors file ({error})", DAMAGED) from None


def load_weights(policy: Any, checkpoint: Checkpoint) -> None:
    """Load a checkpoint's trained weights into ``policy`` (same kind and architecture)."""
    if checkpoint.kind != ("lora" if policy.is_lora else "full"):
        raise ValueError(f"{checkpoint.path} is a {checkpoint.kind} checkpoint, the policy is not")
    require_complete(checkpoint.path)  # hashes what is loaded, once per file version (mage.io.file_sha256)
    if policy.is_lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy.model, _tensors(checkpoint.path / "adapter_model.safetensors"))
    else:
        weights = {}
        for file in sorted(checkpoint.path.glob("model*.safetensors")):
            weights |= _tensors(file)
        missing, unexpected = policy.model.load_state_dict(weights, strict=False)
        # Tied embeddings are saved once: the missing output head shares the input table.
        real_missing = [m for m in missing if not (m.endswith("lm_head.weight") and policy.model.config.tie_word_embeddings)]
        if real_missing or unexpected:
            raise ValueError(f"{checkpoint.path}: missing {real_missing}, unexpected {unexpected}")


def load_trainer_state(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer) -> None:
    """Restore the optimizer state saved with ``checkpoint`` by one process (:func:`load_rng`: the RNG states)."""
    _require(checkpoint.path, [STATE_FILE])
    tensors = _tensors(checkpoint.path / STATE_FILE)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": checkpoint.manifest["optimizer"]["param_groups"]})


def load_rng(checkpoint: Checkpoint) -> None:
    """Restore the torch and Python RNG states saved with ``checkpoint``."""
    _require(checkpoint.path, [STATE_FILE])
    tensors = _tensors(checkpoint.path / STATE_FILE)
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    version, internal, gauss = checkpoint.manifest["python_rng"]
    random.setstate((version, tuple(internal), gauss))
