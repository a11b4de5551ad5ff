"""Cache keys, result persistence and retries shared by the tasks.

:class:`ArtifactCachePolicy` keys a task run on what determines its result:

* the task's own source and the source of the whole ``mage`` package (any change to the
  library's code invalidates every cached result: correct before clever);
* the settings its step reads, as :data:`mage.run.reads.READS` declares them (``settings``
  is always the task's validated :class:`~mage.settings.Settings`);
* every other input, with file references reduced to their content hash, so a new
  checkpoint or table means a new key and a moved-but-equal one does not.

A cached result is reused only while the files it references are intact: if one was
deleted or changed, the policy probes the next key of a short sequence
(``<key>``, ``<key>-1``, ...) and the task runs again under the first free one.

Results are persisted as JSON (file references and small metrics), never as pickles.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import NO_CACHE, TASK_SOURCE, CachePolicy

import mage
from mage.run.reads import READS
from tasks.refs import FileRef, references

MAX_PROBES = 8


@functools.cache
def library_source_hash() -> str:
    """SHA-256 over every Python file of the ``mage`` package (path and content)."""
    root = Path(mage.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def normalise(value: Any) -> Any:
    """A JSON-able stand-in for an input: file references become their content hash."""
    if isinstance(value, FileRef):
        return {"kind": value.kind, "sha256": value.sha256}
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if hasattr(value, "model_dump"):
        return normalise(value.model_dump())
    return value


@dataclass
class ArtifactCachePolicy(CachePolicy):
    """See the module docstring. ``step`` names the step whose declared reads key the task."""

    step: str = ""

    @property
    def sections(self) -> tuple[str, ...]:
        return READS[self.step]

    def base_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any]) -> str:
        settings = inputs["settings"]
        payload = {
            "task": TASK_SOURCE.compute_key(task_ctx, inputs, flow_parameters),
            "library": library_source_hash(),
            "config": settings.values_of(self.sections),
            "inputs": normalise({k: v for k, v in inputs.items() if k != "settings"}),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        base = self.base_key(task_ctx, inputs, flow_parameters)
        store = getattr(task_ctx, "result_store", None)
        if store is None:
            return base
        for attempt in range(MAX_PROBES):
            key = base if attempt == 0 else f"{base}-{attempt}"
            if not store.exists(key):
                return key  # free: the task runs and its result is stored here
            try:
                result = store.read(key).result
            except Exception as error:  # noqa: BLE001 (an unreadable record is stale, whatever the cause)
                _warn_recomputed(task_ctx, f"its cached result {key[:12]} cannot be read ({type(error).__name__})")
                continue
            changed = [ref.path for ref in references(result) if not ref.is_valid()]
            if not changed:
                return key  # a cached result whose files are intact
            _warn_recomputed(task_ctx, f"{', '.join(changed)} changed or disappeared since its cached run wrote it")
        return None  # every probe is stale: run without caching


_WARNED: set[tuple[str, str]] = set()


def _warn_recomputed(task_ctx: Any, why: str) -> None:
    """Nothing silent: a task that runs again because its cached files were damaged says so
    (once per task run: Prefect may compute a key more than once)."""
    import logging

    run_id = str(getattr(getattr(task_ctx, "task_run", None), "id", ""))
    if (run_id, why) in _WARNED:
        return
    _WARNED.add((run_id, why))

    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    name = getattr(getattr(task_ctx, "task", None), "name", "a task")
    try:
        log = get_run_logger()  # the task run's logger: the line reaches the UI too
    except MissingContextError:
        log = logging.getLogger(__name__)
    log.warning(f"{name}: {why}; computing it again")


def is_transient(exception: BaseException | None) -> bool:
    """Failures worth retrying: I/O and network errors, timeouts, CUDA hiccups. Configuration
    and programming errors (ValueError, TypeError, KeyError, ...) fail at once; an error that
    says so itself (an attribute ``transient``, True or False) is taken at its word, whatever it wraps."""
    if exception is None:
        return False
    if getattr(exception, "transient", None) is not None:  # the error knows (True or False)
        return bool(exception.transient)
    if isinstance(exception, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False  # a missing input (a stale reference included) stays missing
    if isinstance(exception, OSError):  # TimeoutError and ConnectionError included
        return True
    name = type(exception).__name__
    if any(type(e).__module__.startswith("ray.") and type(e).__name__ in RAY_LOST_WORK for e in _causes(exception)):
        return True  # a worker actor or node died: its shard is played again (the actor has restarted)
    return name == "OutOfMemoryError" or (isinstance(exception, RuntimeError) and "CUDA" in str(exception))


#: Ray's errors for work lost with a process or node, not caused by it.
RAY_LOST_WORK = {"RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError", "NodeDiedError",
                 "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError"}


def _causes(exception: BaseException) -> list[BaseException]:
    """The exception and what it wraps (Ray re-raises a remote error inside a RayTaskError)."""
    chain, seen = [], set()
    while exception is not None and id(exception) not in seen:
        seen.add(id(exception))
        chain.append(exception)
        exception = exception.__cause__ or exception.__context__
    return chain


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only transient failures."""
    try:
        exception = state.result(raise_on_failure=False)
    except Exception as error:  # the state could not be read: be conservative and retry
        exception = error
    return is_transient(exception if isinstance(exception, BaseException) else None)


def backoff(first_delay: float, retries: int) -> list[float]:
    """Exponential backoff: ``first_delay``, twice that, four times, ..."""
    return [first_delay * 2**attempt for attempt in range(retries)]


def configured(task: Any, flow_cfg: Any) -> Any:
    """``task`` with the retries of ``params/flow`` (exponential backoff); a task made with no
    retries (the policy update) keeps none."""
    retries = min(task.retries, flow_cfg.retries)
    return task.with_options(retries=retries, retry_delay_seconds=backoff(flow_cfg.retry_delay_seconds, retries))


#: Options every cached task of the pipeline shares (retries are set per flow from ``params/flow``).
TASK_DEFAULTS: dict[str, Any] = {
    "persist_result": True,
    "result_serializer": "json",
    "retries": 2,
    "retry_delay_seconds": backoff(2.0, 2),
    "retry_condition_fn": retry_transient,
}
#: Options of the training iteration's steps: never cached (the run resumes from its
#: checkpoints) and their results stay in memory (tables, the training state).
STEP_DEFAULTS: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "persist_result": False,
    "retries": 2,
    "retry_delay_seconds": backoff(2.0, 2),
    "retry_condition_fn": retry_transient,
}
