"""Prefect tasks: thin wrappers over ``mage`` with cache policies, retries and file references."""

from tasks.pipeline import (
    evaluate_checkpoint,
    prepare_model,
    rollout_shard,
    score_rollout,
    seed_population,
    train_iteration,
    write_report,
)
from tasks.refs import FileRef, StaleReferenceError

__all__ = [
    "FileRef",
    "StaleReferenceError",
    "evaluate_checkpoint",
    "prepare_model",
    "rollout_shard",
    "score_rollout",
    "seed_population",
    "train_iteration",
    "write_report",
]
