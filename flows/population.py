"""Flow ``seed_population``: the first stage of the lifecycle, the population manifest."""

from __future__ import annotations

from prefect import flow

from flows.common import logger, settings_for
from mage.population.manifest import adaptation_lines, load_manifest
from tasks.caching import configured
from tasks.population import seed_population as seed_population_task
from tasks.refs import FileRef


@flow(name="seed_population")
def seed_population(overrides: list[str] | None = None, config_file: str | None = None) -> FileRef:
    """Write the population manifest: every opponent of ``params/population/<game>`` with its
    split, share and ceilings (best-response return, win probability of a player who knows it,
    and per split the three ceilings by episode k)."""
    settings = settings_for(overrides, config_file)
    manifest = configured(seed_population_task, settings.flow)(settings)
    written = load_manifest(manifest.resolve())
    for opponent in written["opponents"]:
        mean = opponent["ceilings"]["mean"]
        logger().info(
            f"{opponent['split']:>8} {opponent['id']}: share {opponent['share']:.3f}, ceilings: best-response return "
            f"{mean['best_response_return']:+.3f}, max win probability {mean['max_win_probability']:.3f}"
        )
    for line in adaptation_lines(written):
        logger().info(line)
    return manifest
