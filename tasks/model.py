"""The ``prepare-model`` task: the base model directory (the tiny preset built, or a hub model fetched)."""

from __future__ import annotations

from typing import Any

from prefect import task

from mage.models.build import MODEL_BUILD_SECTIONS
from mage.models.policy import ensure_model
from mage.settings import Settings
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


@task(name="prepare-model", task_run_name="prepare-model", cache_policy=ArtifactCachePolicy(sections=MODEL_BUILD_SECTIONS),
      **TASK_DEFAULTS)
def prepare_model(config: dict[str, Any]) -> FileRef:
    """Build the tiny preset, or fetch a hub model into the local cache; reference its directory."""
    return FileRef.of(ensure_model(Settings.from_config(config), progress=False), "directory")
