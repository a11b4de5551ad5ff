"""The ``seed-population`` task: the population manifest with its ceilings."""

from __future__ import annotations

from prefect import task

from mage.population.manifest import seed_population as build_manifest
from mage.population.manifest import write_manifest
from mage.settings import Settings
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy
from tasks.refs import FileRef


@task(name="seed-population", task_run_name="seed-population",
      cache_policy=ArtifactCachePolicy(step="seed_population"), **TASK_DEFAULTS)
def seed_population(settings: Settings) -> FileRef:
    """Write the population manifest (opponents, shares, splits, ceilings)."""
    manifest = build_manifest(settings, progress=False)
    return FileRef.of(write_manifest(manifest, settings.paths.population_manifest))
