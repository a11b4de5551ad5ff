"""Multi-episode rollouts: the meta-episode engine, prompts, the trajectory table, metrics."""

from mage.rollout.engine import RolloutEngine, RolloutStats
from mage.rollout.metrics import episode_outcomes, rollout_metrics
from mage.rollout.plan import MetaEpisodeSpec, plan_meta_episodes
from mage.rollout.schema import BASE_COLUMNS, DERIVED_COLUMNS, read_trajectories, validate, write_trajectories

__all__ = [
    "BASE_COLUMNS",
    "DERIVED_COLUMNS",
    "MetaEpisodeSpec",
    "RolloutEngine",
    "RolloutStats",
    "episode_outcomes",
    "plan_meta_episodes",
    "read_trajectories",
    "rollout_metrics",
    "validate",
    "write_trajectories",
]
