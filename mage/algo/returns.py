r"""Rewards and returns of a trajectory table (docs/method.md, Rewards and returns).

``add_returns(table, cfg, penalties)`` adds four columns (see ``mage.rollout.schema``):

``meta_reward`` (per episode n of a meta-episode, on every row of the episode): the
``algo.objective``, a function registered by name in :data:`OBJECTIVES`
    differential (MAGE):   D_n = R(\tau_n) - R(\tau_{n-1}),  R(\tau_0) = 0
    cumulative (LaMer):    R(\tau_n)
    single_episode:        R(\tau_n), and no credit crosses an episode boundary
    Summed over a meta-episode the differential rewards telescope to R(\tau_N).
    A new objective is one function decorated with :func:`register_objective`.

``penalty`` (per call, <= 0; c_inv and c_len are the game's, L_max the sampling limit: :class:`Penalties`)
    -c_inv                                        if the reply was invalid
    -c_len * min(1, (L - L_max/2) / (L_max/2))    if its length L > L_max / 2

``reward`` (per call)
    r_t = penalty_t + meta_reward_n on the last play call of episode n, else penalty_t

``step_return`` (per call), backwards through the meta-episode
    inside an episode:          G_t = r_t + gamma_step * G_{t+1}
    across a boundary:          G_last(n) = r_last(n) + gamma_traj * G_first(n+1)
    a reflection (before n+1):  G = r_reflection + G_first(n+1)
where G_first(n+1) is the return of episode n+1's first play call. With an objective that
does not cross episodes (``single_episode``) gamma_traj is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from mage.config.sections import AlgoSection

META_EPISODE = ["run_id", "iteration", "meta_id"]
ORDER = [*META_EPISODE, "episode", "turn"]


@dataclass(frozen=True)
class Penalties:
    """What a call is penalised for (docs/method.md, Rewards and returns): c_inv and c_len are
    the game's (``game.invalid_penalty``, ``game.length_penalty``), L_max the sampling limit."""

    invalid: float  # c_inv per invalid reply
    length: float  # c_len
    max_response_tokens: int  # L_max


@dataclass(frozen=True)
class Objective:
    """A meta-reward: an expression over one row per (meta-episode, episode), sorted by
    episode, with its ``episode_return``; and whether credit crosses episode boundaries."""

    meta_reward: Callable[[], pl.Expr]
    crosses_episodes: bool


#: ``algo.objective`` names to their meta-rewards.
OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str, crosses_episodes: bool = True) -> Callable[[Callable[[], pl.Expr]], Callable[[], pl.Expr]]:
    """Register a meta-reward under ``name`` (what ``algo.objective`` selects)."""

    def register(meta_reward: Callable[[], pl.Expr]) -> Callable[[], pl.Expr]:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is registered twice")
        OBJECTIVES[name] = Objective(meta_reward, crosses_episodes)
        return meta_reward

    return register


@register_objective("differential")
def differential() -> pl.Expr:
    """MAGE: D_n = R(tau_n) - R(tau_{n-1}), R(tau_0) = 0."""
    return pl.col("episode_return") - pl.col("episode_return").shift(1).over(META_EPISODE).fill_null(0.0)


@register_objective("cumulative")
def cumulative() -> pl.Expr:
    """LaMer: R(tau_n), discounted across episodes by gamma_traj."""
    return pl.col("episode_return")


@register_objective("single_episode", crosses_episodes=False)
def single_episode() -> pl.Expr:
    """Plain RL: R(tau_n), and no credit crosses an episode boundary."""
    return pl.col("episode_return")


def penalty_expression(penalties: Penalties) -> pl.Expr:
    """The per-call penalty expression (invalid reply, length)."""
    half = penalties.max_response_tokens / 2
    length = pl.col("response_token_ids").list.len().cast(pl.Float64)
    over = ((length - half) / half).clip(upper_bound=1.0)
    length_term = pl.when(length > half).then(-penalties.length * over).otherwise(0.0)
    invalid_term = pl.when(pl.col("valid")).then(0.0).otherwise(-penalties.invalid)
    return (invalid_term + length_term).alias("penalty")


def meta_rewards(table: pl.DataFrame, objective: str) -> pl.DataFrame:
    """One row per (meta-episode, episode) with its ``meta_reward``."""
    episodes = table.group_by(*META_EPISODE, "episode").agg(pl.col("episode_return").first()).sort(*META_EPISODE, "episode")
    return episodes.select(*META_EPISODE, "episode", OBJECTIVES[objective].meta_reward().alias("meta_reward"))


def discounted_returns(
    meta_ids: np.ndarray,
    episodes: np.ndarray,
    is_play: np.ndarray,
    rewards: np.ndarray,
    gamma_step: float,
    gamma_traj: float,
) -> np.ndarray:
    """Backward pass of the step returns over rows sorted by (meta-episode, episode, turn).

    ``meta_ids`` holds one integer per meta-episode (rows of one meta-episode adjacent).
    """
    returns = np.zeros(len(rewards))
    next_return: float | None = None  # G of the chronologically next play call
    next_episode = -1
    for i in range(len(rewards) - 1, -1, -1):
        if i == len(rewards) - 1 or meta_ids[i] != meta_ids[i + 1]:
            next_return, next_episode = None, -1  # a new meta-episode (seen from its end)
        if is_play[i]:
            if next_return is None:
                g = rewards[i]
            elif next_episode == episodes[i]:
                g = rewards[i] + gamma_step * next_return
            else:
                g = rewards[i] + gamma_traj * next_return
            next_return, next_episode = g, episodes[i]
        else:  # a reflection takes the return of the first play call after it
            follows = next_return if next_return is not None and next_episode == episodes[i] else 0.0
            g = rewards[i] + follows
        returns[i] = g
    return returns


def add_returns(table: pl.DataFrame, cfg: AlgoSection, penalties: Penalties) -> pl.DataFrame:
    """Add ``meta_reward``, ``penalty``, ``reward`` and ``step_return``; see the module docstring."""
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {cfg.objective!r}")
    sorted_table = table.sort(ORDER).drop(["meta_reward", "penalty", "reward", "step_return"], strict=False)
    with_rewards = (
        sorted_table.join(meta_rewards(sorted_table, cfg.objective), on=[*META_EPISODE, "episode"], how="left")
        .with_columns(penalty_expression(penalties))
        .with_columns(
            (pl.col("penalty") + pl.when(pl.col("done") & (pl.col("phase") == "play")).then(pl.col("meta_reward")).otherwise(0.0)).alias(
                "reward"
            )
        )
    )
    meta_index = with_rewards.select(pl.struct(META_EPISODE).rank("dense")).to_series().to_numpy()
    gamma_traj = cfg.gamma_traj if OBJECTIVES[cfg.objective].crosses_episodes else 0.0
    step_return = discounted_returns(
        meta_index,
        with_rewards["episode"].to_numpy(),
        (with_rewards["phase"] == "play").to_numpy(),
        with_rewards["reward"].to_numpy(),
        cfg.gamma_step,
        gamma_traj,
    )
    return with_rewards.with_columns(pl.Series("step_return", step_return, dtype=pl.Float64))
