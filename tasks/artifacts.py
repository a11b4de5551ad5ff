"""What the Prefect UI shows beside the logs: a run's training table and its reports, as artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mage.population.league import rating_rows


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    text = "-".join(parts).lower()
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


TABLE_COLUMNS = (
    ("iteration", "iteration"),
    ("rollout/all/final_mean_return", "final return"),
    ("rollout/all/final_win_rate", "final win rate"),
    ("rollout/all/return_gain", "return gain"),
    ("rollout/invalid_rate", "invalid rate"),
    ("train/loss", "loss"),
    ("train/kl", "KL"),
    ("train/entropy", "entropy"),
    ("train/exploitability", "exploitability"),
    ("rollout/meta_episodes_per_second", "meta-episodes/s"),
    ("train/tokens_per_second", "train tokens/s"),
)


def publish_training_table(run_name: str, history: Sequence[Mapping[str, Any]]) -> None:
    """The per-iteration metrics as a table artifact (the UI's Artifacts tab)."""
    rows = [{label: _rounded(m.get(key)) for key, label in TABLE_COLUMNS} for m in history]
    create_table_artifact(table=rows, key=artifact_key(run_name, "training"),
                          description=f"Training metrics of {run_name}, one row per iteration")


def publish_league_table(run_name: str, history: Sequence[Mapping[str, Any]]) -> None:
    """With ``population.league``: the ratings per iteration as a table artifact."""
    labels = {"mu": "mu", "sigma": "sigma", "win_probability": "P(agent wins)", "share": "share of groups"}
    rows = [{labels.get(k, k): _rounded(v) for k, v in row.items()} for row in rating_rows(history)]
    if rows:
        create_table_artifact(table=rows, key=artifact_key(run_name, "league"),
                              description=f"League ratings of {run_name} (openskill), per iteration and player")


def publish_markdown(key: str, markdown: str, description: str) -> None:
    create_markdown_artifact(markdown=markdown, key=artifact_key(key), description=description)


def _rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value
