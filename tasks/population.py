"""The ``seed-population`` task: the population manifest with its ceilings."""

from __future__ import annotations

from typing import Any

from prefect import task

from mage.population import seed_population as build_manifest
from mage.population import write_manifest
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


@task(name="seed-population", task_run_name="seed-population", cache_policy=ArtifactCachePolicy(sections=("game", "population", "paths.population_manifest")),
      **TASK_DEFAULTS)
def seed_population(config: dict[str, Any]) -> FileRef:
    """Write the population manifest (opponents, shares, splits, ceilings)."""
    manifest = build_manifest(config, progress=False)
    return FileRef.of(write_manifest(manifest, config["paths"]["population_manifest"]))
