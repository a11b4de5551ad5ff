r"""Advantages of a trajectory table (docs/method.md, Advantages). Input: ``add_returns``'s output.

``algo.estimator`` names a function registered in :data:`ESTIMATORS` (as verl's
``core_algos`` registers its estimators): a new one is one function decorated with
:func:`register_estimator`. It adds ``episode_score``, ``advantage_episode`` and
``advantage_step`` (each [rows], Float64) given the group and normalisation scope keys;
:func:`add_advantages` then combines them into ``advantage``.

**GiGPO with agent-specific groups** (``estimator: gigpo``). A group g holds the calls of
the meta-episodes that share the initial state (seed and seat) and the opponent, within
one run and iteration: groups never mix opponents.

    episode term   s_i = meta_reward(episode of i) + penalty_i
                   A_ep,i = s_i - mean_{j in g} s_j                    (mean_norm)
                   A_ep,i = (s_i - mean_{j in g} s_j) / (std_g + eps)  (mean_std_norm)
    step term      anchor(i) = (g, observation_i)   for a play call,
                               (g, "reflection")    for a reflection;
                   with ``anchor: local`` the episode number is part of the anchor
                   A_step,i = G_i - mean_{j in anchor(i)} G_j   (or / (std + eps));
                   singleton anchors give 0
    advantage      A_i = A_ep,i + w * A_step,i

Penalties reach both terms: through s_i and through the rewards inside G_i.

``grouping: mixed`` is the paper's ablation of stationary grouping: the rollouts deal a
group's meta-episodes to different opponents (``mage.rollout.plan_meta_episodes``), and a
group and its anchors are keyed by the initial state and seat alone.

``norm_scope: opponent`` is the paper's agent-specific normalisation A^(m): the episode
term's mean and std are taken over every call against opponent m in the batch instead of
over the group (the step term's anchors already include the opponent).

``episode_baseline: per_episode`` takes the episode term's mean and std over the scope's
calls of the same episode number only. Pooled (the paper's), the baseline is one number for
calls that expect very different scores: under the differential reward with early stop, an
episode after a loss scores R_n + 10 >= 0, so every call of episode 1 starts far below the
mean. Both are baselines in the policy-gradient sense (neither depends on the call's reply
beyond its own share of the mean, as in GRPO); the per-episode one leaves no episode with a
systematic sign (docs/notes/findings.md, "Why Tic-Tac-Toe unlearned"). GRPO ignores it: its
statistics are over whole meta-episodes.

**GRPO** (``estimator: grpo``), the baseline: every call of a meta-episode gets
(S - mean_g S) / (std_g + eps), S being the meta-episode's summed reward and the
statistics taken over the group's meta-episodes (or the mean-only version with
``norm: mean_norm``).

``negative_weight`` (default 1, the method) scales every negative ``advantage`` last, for
either estimator; ``advantage_episode`` and ``advantage_step`` keep their unscaled values.
Below 1 it departs from the method (docs/method.md, Deviations): the update leans on the
calls that did better than their baseline. It is meant for a policy that rarely succeeds,
where the few successes raise the mean and most calls sit a little below it. At 0 only positive advantages remain, akin to
self-imitation learning's (R - V)+ (Oh et al. 2018) without its replay buffer. On Sokoban's
reading warm start it did not help (docs/notes/findings.md, "Self-imitation, and where the
updates go").

Standard deviations are population ones (ddof 0).
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from mage.algo.returns import META_EPISODE, ORDER
from mage.config.sections import AlgoSection

RUN = ["run_id", "iteration"]
GROUP = [*RUN, "seed", "seat", "opponent"]
REQUIRED = ["meta_reward", "penalty", "reward", "step_return"]

#: An estimator: (table with returns, algo settings, group keys, normalisation scope keys)
#: -> the table with ``episode_score``, ``advantage_episode`` and ``advantage_step``.
Estimator = Callable[[pl.DataFrame, AlgoSection, list[str], list[str]], pl.DataFrame]
#: ``algo.estimator`` names to their functions.
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register an advantage estimator under ``name`` (what ``algo.estimator`` selects)."""

    def register(estimator: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} is registered twice")
        ESTIMATORS[name] = estimator
        return estimator

    return register


def _normalised(value: str, over: list[str], cfg: AlgoSection, singleton_zero: bool = False) -> pl.Expr:
    centred = pl.col(value) - pl.col(value).mean().over(over)
    if cfg.norm == "mean_std_norm":
        centred = centred / (pl.col(value).std(ddof=0).over(over) + cfg.epsilon)
    if singleton_zero:
        centred = pl.when(pl.len().over(over) > 1).then(centred).otherwise(0.0)
    return centred


def _weighted(advantage: pl.Expr, cfg: AlgoSection) -> pl.Expr:
    if cfg.negative_weight == 1.0:
        return advantage
    return pl.when(advantage < 0).then(advantage * cfg.negative_weight).otherwise(advantage)


@register_estimator("grpo")
def grpo(table: pl.DataFrame, cfg: AlgoSection, group: list[str], scope: list[str]) -> pl.DataFrame:
    """Every call of a meta-episode gets its meta-episode's normalised summed reward; no step term."""
    # Statistics over meta-episodes (trajectories), not over their calls.
    per_meta = (
        table.group_by(*META_EPISODE)
        .agg(pl.col("reward").sum().alias("episode_score"), *[pl.col(c).first() for c in set(scope) - set(META_EPISODE)])
        .with_columns(_normalised("episode_score", scope, cfg).alias("advantage_episode"))
        .select(*META_EPISODE, "episode_score", "advantage_episode")
    )
    return table.join(per_meta, on=META_EPISODE, how="left").with_columns(pl.lit(0.0).alias("advantage_step"))


@register_estimator("gigpo")
def gigpo(table: pl.DataFrame, cfg: AlgoSection, group: list[str], scope: list[str]) -> pl.DataFrame:
    """The episode term over the scope, the step term over anchors (see the module docstring)."""
    if cfg.episode_baseline == "per_episode":
        scope = [*scope, "episode"]
    anchor = pl.when(pl.col("phase") == "play").then(pl.col("observation")).otherwise(pl.lit("<reflection>"))
    anchor_key = [*group, "_anchor"] + (["episode"] if cfg.anchor == "local" else [])
    return (
        table.with_columns((pl.col("meta_reward") + pl.col("penalty")).alias("episode_score"), anchor.alias("_anchor"))
        .with_columns(
            _normalised("episode_score", scope, cfg).alias("advantage_episode"),
            _normalised("step_return", anchor_key, cfg, singleton_zero=True).alias("advantage_step"),
        )
        .drop("_anchor")
    )


def add_advantages(table: pl.DataFrame, cfg: AlgoSection) -> pl.DataFrame:
    """Add ``episode_score``, ``advantage_episode``, ``advantage_step`` and ``advantage``."""
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"add_advantages needs add_returns's columns first; missing {missing}")
    if cfg.estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {cfg.estimator!r}")
    table = table.drop(["episode_score", "advantage_episode", "advantage_step", "advantage"], strict=False)
    group = GROUP if cfg.grouping == "stationary" else [c for c in GROUP if c != "opponent"]
    scope = group if cfg.norm_scope == "group" else [*RUN, "opponent"]
    scored = ESTIMATORS[cfg.estimator](table, cfg, group, scope)
    combined = pl.col("advantage_episode") + cfg.step_weight * pl.col("advantage_step")
    return scored.with_columns(_weighted(combined, cfg).alias("advantage")).sort(ORDER)
