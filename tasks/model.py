"""The ``prepare-model`` task: the base model directory (the tiny preset built, or a hub model fetched)."""

from __future__ import annotations

from prefect import get_run_logger, task

from mage.settings import Settings
from mage.warmstart import prepare_model as prepare
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


@task(name="prepare-model", task_run_name="prepare-model", cache_policy=ArtifactCachePolicy(step="prepare_model"),
      **TASK_DEFAULTS)
def prepare_model(settings: Settings) -> FileRef:
    """Build the tiny preset, or fetch a hub model into the local cache; reference its directory."""
    model, log = settings.model, get_run_logger()
    log.info(f"preparing {model.path}" + (" (the tiny preset is built if it is not there)"
                                          if model.build == "tiny" else ""))
    return FileRef.of(prepare(settings, progress=False, say=log.info), "directory")
