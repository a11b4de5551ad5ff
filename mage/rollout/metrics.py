"""Metrics from a trajectory table (docs/method.md, The metrics), per opponent and per episode k.

Definitions (``episodes`` = meta-episodes of the opponent):

* ``played``: meta-episodes that played episode k (with early stop, one that has won
  stops playing);
* ``win_rate``, ``draw_rate``, ``mean_return``: over the meta-episodes that played k;
* ``pass_at_k``: share of *all* meta-episodes won in at least one of episodes 1..k
  (with early stop this is the meta-episode's success by episode k);
* ``invalid_rate``: share of play calls of episode k whose reply was invalid;
* ``reflection_validity``: share of reflections written before episode k that were valid
  (null for k = 1 or when no reflections were asked for);
* ``mean_response_tokens``: mean length of the replies in episode k (tokens, or
  characters / 4 when the backend gave no tokens).

The row with ``opponent == "all"`` pools every opponent.

:func:`final_episode_metrics` summarises each meta-episode by its first and its final
(last played) episode: with early stop the final episode is the won one or episode N, so
``final_win_rate`` is the meta-episode's success (pass@N), and ``gain`` = final - first is
the exploration-exploitation gain.
"""

from __future__ import annotations

import polars as pl

ALL = "all"


def episode_outcomes(table: pl.DataFrame) -> pl.DataFrame:
    """One row per (meta-episode, episode): opponent, seat, return, won, draw, truncated."""
    return (
        table.filter(pl.col("phase") == "play")
        .group_by("run_id", "iteration", "meta_id", "episode")
        .agg(
            pl.col("opponent").first(),
            pl.col("seat").first(),
            pl.col("group_id").first(),
            pl.col("episode_return").first(),
            pl.col("won").first(),
            pl.col("draw").first(),
            pl.col("truncated").first(),
        )
        .sort("run_id", "iteration", "meta_id", "episode")
    )


def _response_length() -> pl.Expr:
    tokens = pl.col("response_token_ids").list.len()
    return pl.when(tokens > 0).then(tokens).otherwise(pl.col("response").str.len_chars() / 4)


def _per_opponent(table: pl.DataFrame, label: str | None) -> pl.DataFrame:
    opponent = pl.lit(label) if label else pl.col("opponent")
    outcomes = episode_outcomes(table).with_columns(opponent.alias("opponent"))
    metas = outcomes.group_by("opponent").agg(pl.struct("run_id", "iteration", "meta_id").n_unique().alias("meta_episodes"))
    per_k = outcomes.group_by("opponent", "episode").agg(
        pl.len().alias("played"),
        pl.col("won").mean().alias("win_rate"),
        pl.col("draw").mean().alias("draw_rate"),
        pl.col("episode_return").mean().alias("mean_return"),
    )
    # pass@k: won within the first k episodes, over all meta-episodes of the opponent.
    first_win = (
        outcomes.filter(pl.col("won"))
        .group_by("opponent", "run_id", "iteration", "meta_id")
        .agg(pl.col("episode").min().alias("first_win"))
    )
    ks = per_k.select("opponent", "episode")
    passes = (
        ks.join(first_win, on="opponent", how="left")
        .group_by("opponent", "episode")
        .agg((pl.col("first_win") <= pl.col("episode")).sum().alias("wins_by_k"))
    )
    calls = table.with_columns(opponent.alias("opponent"), _response_length().alias("response_length"))
    play = calls.filter(pl.col("phase") == "play").group_by("opponent", "episode").agg(
        (1.0 - pl.col("valid").cast(pl.Float64).mean()).alias("invalid_rate"),
        pl.col("response_length").mean().alias("mean_response_tokens"),
    )
    reflect = calls.filter(pl.col("phase") == "reflect").group_by("opponent", "episode").agg(
        pl.col("valid").cast(pl.Float64).mean().alias("reflection_validity")
    )
    return (
        per_k.join(metas, on="opponent")
        .join(passes, on=["opponent", "episode"], how="left")
        .join(play, on=["opponent", "episode"], how="left")
        .join(reflect, on=["opponent", "episode"], how="left")
        .with_columns((pl.col("wins_by_k").fill_null(0) / pl.col("meta_episodes")).alias("pass_at_k"))
        .select(
            "opponent", "episode", "meta_episodes", "played", "win_rate", "draw_rate", "mean_return",
            "pass_at_k", "invalid_rate", "reflection_validity", "mean_response_tokens",
        )
    )


def rollout_metrics(table: pl.DataFrame) -> pl.DataFrame:
    """Per opponent (and pooled, ``opponent == "all"``) and per episode k; see the module docstring."""
    if table.is_empty():
        raise ValueError("no rows: cannot compute metrics of an empty trajectory table")
    per_opponent = _per_opponent(table, None)
    pooled = _per_opponent(table, ALL)
    return pl.concat([per_opponent, pooled]).sort(pl.col("opponent") == ALL, "opponent", "episode")


def final_episode_metrics(table: pl.DataFrame) -> pl.DataFrame:
    """Per opponent (and ``all``): first vs final episode win rate and mean return."""
    outcomes = episode_outcomes(table)
    ends = outcomes.group_by("run_id", "iteration", "meta_id").agg(
        pl.col("opponent").first(),
        pl.col("won").sort_by("episode").first().alias("first_won"),
        pl.col("episode_return").sort_by("episode").first().alias("first_return"),
        pl.col("won").sort_by("episode").last().alias("final_won"),
        pl.col("draw").sort_by("episode").last().alias("final_draw"),
        pl.col("episode_return").sort_by("episode").last().alias("final_return"),
        pl.col("episode").max().alias("episodes_played"),
    )

    def summary(frame: pl.DataFrame, label: str | None) -> pl.DataFrame:
        keys = [pl.lit(label).alias("opponent")] if label else [pl.col("opponent")]
        return frame.group_by(*keys).agg(
            pl.len().alias("meta_episodes"),
            pl.col("first_won").mean().alias("first_win_rate"),
            pl.col("final_won").mean().alias("final_win_rate"),
            pl.col("final_draw").mean().alias("final_draw_rate"),
            pl.col("first_return").mean().alias("first_mean_return"),
            pl.col("final_return").mean().alias("final_mean_return"),
            pl.col("episodes_played").mean().alias("mean_episodes_played"),
        ).with_columns(
            (pl.col("final_win_rate") - pl.col("first_win_rate")).alias("win_rate_gain"),
            (pl.col("final_mean_return") - pl.col("first_mean_return")).alias("return_gain"),
        )

    return pl.concat([summary(ends, None), summary(ends, ALL)]).sort(pl.col("opponent") == ALL, "opponent")
