"""The trajectory table: one row per LLM call of a rollout, as a polars frame.

This is the one place the schema is documented. Rollouts write the base columns, the
advantage code (``mage.algo``) adds the derived ones, the trainer reads them and the
evaluation aggregates them. :func:`read_trajectories` checks a file against it.

Numbering: ``episode`` counts from 1 to N inside a meta-episode; ``turn`` counts the play
calls of an episode from 1. A reflection written after episode k belongs to episode k+1
(it shapes that episode and, for returns, takes the return of its first play step); it
has ``phase == "reflect"`` and ``turn == 0``, so sorting by (meta_id, episode, turn) gives
the order of the calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import polars as pl

from mage import io

#: Written by the rollout engine. name -> (dtype, meaning)
BASE_COLUMNS: dict[str, tuple[pl.DataType, str]] = {
    "run_id": (pl.String, "run the rows belong to"),
    "iteration": (pl.Int64, "training iteration (or evaluation round) that produced the rows"),
    "policy_version": (pl.Int64, "updates the sampling weights had seen: in training iteration - 1, or one "
                                 "fewer for a rollout played behind the update (train.max_staleness); in an "
                                 "evaluation the checkpoint's iteration; null in a table written before the column"),
    "group_id": (pl.Int64, "meta-episodes of a group share initial-state seed and opponent"),
    "meta_id": (pl.Int64, "meta-episode, unique within (run_id, iteration)"),
    "game": (pl.String, "game name (OpenSpiel's, or sokoban)"),
    "opponent": (pl.String, "population entry id of the hidden opponent"),
    "seat": (pl.Int64, "agent's seat: 0 first, 1 second"),
    "seed": (pl.Int64, "initial-state seed of the group"),
    "initial_state": (pl.String, "JSON snapshot of the episode's initial state (replayable)"),
    "episode": (pl.Int64, "episode number in the meta-episode, 1..N"),
    "turn": (pl.Int64, "play call number in the episode from 1; 0 for a reflection"),
    "phase": (pl.String, "'play' or 'reflect'"),
    "observation": (pl.String, "the state the call saw (board, card, history): the GiGPO step anchor"),
    "prompt": (pl.String, "user message given to the model (before the chat template)"),
    "response": (pl.String, "the model's reply"),
    "prompt_token_ids": (pl.List(pl.Int64), "prompt tokens as the model saw them (chat template applied)"),
    "response_token_ids": (pl.List(pl.Int64), "sampled tokens"),
    "response_logprobs": (pl.List(pl.Float64), "log p of each sampled token under the rollout model, at temperature 1"),
    "finish_reason": (pl.String, "'stop' (stop string or end of sequence) or 'length'"),
    "dropped_episodes": (pl.Int64, "finished-episode blocks dropped from the prompt to fit the context"),
    "action": (pl.String, "parsed move(s) in words, comma-separated; null when invalid or reflecting"),
    "valid": (pl.Boolean, "play: a legal action was parsed; reflect: a non-empty <remark> was found"),
    "invalid_reason": (pl.String, "why the reply was invalid; null when valid"),
    "step_reward": (pl.Float64, "environment reward of this step: the episode return on its last step, else 0"),
    "episode_return": (pl.Float64, "R(tau) of the row's episode (scaled payoff; forfeit if truncated)"),
    "won": (pl.Boolean, "the row's episode was won"),
    "draw": (pl.Boolean, "the row's episode was drawn"),
    "truncated": (pl.Boolean, "the row's episode hit the turn limit before the game ended"),
    "done": (pl.Boolean, "this call ended its episode"),
}

#: Added by ``mage.algo`` (returns and advantages). name -> (dtype, meaning)
DERIVED_COLUMNS: dict[str, tuple[pl.DataType, str]] = {
    "meta_reward": (pl.Float64, "reward of the episode under the objective (MAGE: D_n = R_n - R_{n-1})"),
    "penalty": (pl.Float64, "penalties of this call (invalid action, length), <= 0"),
    "reward": (pl.Float64, "per-call reward: meta_reward on the episode's last step, plus penalty"),
    "step_return": (pl.Float64, "discounted return G_t of the call"),
    "episode_score": (pl.Float64, "s_i: meta_reward of the row's episode plus the row's penalty"),
    "advantage_episode": (pl.Float64, "GiGPO episode-level term"),
    "advantage_step": (pl.Float64, "GiGPO step-level term"),
    "advantage": (pl.Float64,
                  "A_ep + w * A_step, negatives times algo.negative_weight; broadcast over the response tokens"),
}

ALL_COLUMNS = BASE_COLUMNS | DERIVED_COLUMNS
BASE_SCHEMA = pl.Schema({name: dtype for name, (dtype, _) in BASE_COLUMNS.items()})


class SchemaError(ValueError):
    """A trajectory table does not match the documented schema."""


def empty_table() -> pl.DataFrame:
    return pl.DataFrame(schema=BASE_SCHEMA)


def from_rows(rows: Sequence[Mapping[str, object]]) -> pl.DataFrame:
    """Build a table from row dicts carrying exactly the base columns."""
    if not rows:
        return empty_table()
    return pl.DataFrame([{name: row[name] for name in BASE_SCHEMA} for row in rows], schema=BASE_SCHEMA)


def validate(table: pl.DataFrame, required: Iterable[str] = BASE_COLUMNS) -> pl.DataFrame:
    """Check required columns exist and every documented column has its dtype."""
    missing = [name for name in required if name not in table.columns]
    if missing:
        raise SchemaError(f"trajectory table lacks column(s) {missing}")
    wrong = {
        name: (str(table.schema[name]), str(ALL_COLUMNS[name][0]))
        for name in table.columns
        if name in ALL_COLUMNS and table.schema[name] != ALL_COLUMNS[name][0]
    }
    if wrong:
        raise SchemaError("column dtype(s) differ from the schema (found, expected): " + repr(wrong))
    phases = set(table["phase"].unique().to_list()) - {"play", "reflect"}
    if phases:
        raise SchemaError(f"unknown phase value(s) {sorted(phases)}")
    return table


def write_trajectories(table: pl.DataFrame, path: str | Path) -> Path:
    """Validate and write a table as parquet, atomically."""
    validate(table)
    return io.atomic_write(path, lambda tmp: table.write_parquet(tmp, compression="zstd"))


def read_trajectories(path: str | Path, required: Iterable[str] = BASE_COLUMNS) -> pl.DataFrame:
    """Read a parquet table and check it against the schema. A table written before its rows
    recorded ``policy_version`` gets the column, null (unknown), where the schema places it."""
    table = pl.read_parquet(path)
    if "policy_version" not in table.columns and "iteration" in table.columns:
        at = table.columns.index("iteration") + 1
        table = table.with_columns(pl.lit(None, dtype=pl.Int64).alias("policy_version")).select(
            [*table.columns[:at], "policy_version", *table.columns[at:]])
    return validate(table, required)


def describe() -> str:
    """The schema as a Markdown table (the one in docs/trajectory-table.md)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    for name, (dtype, meaning) in ALL_COLUMNS.items():
        lines.append(f"| `{name}` | {dtype} | {meaning} |")
    return "\n".join(lines)
