"""Settings of returns, advantages and the PPO loss (``params/algo``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass as validated_dataclass

Objective = Literal["differential", "cumulative", "single_episode"]
Estimator = Literal["gigpo", "grpo"]
Anchor = Literal["global", "local"]
Norm = Literal["mean_norm", "mean_std_norm"]
NormScope = Literal["group", "opponent"]
EpisodeBaseline = Literal["pooled", "per_episode"]
Grouping = Literal["stationary", "mixed"]

Discount = Annotated[float, Field(ge=0, le=1)]
NonNegative = Annotated[float, Field(ge=0)]


@validated_dataclass(frozen=True)
class AlgoConfig:
    """MAGE-SPEC sections 3-5; defaults are the paper's (invalid penalty: the paper's 0.5).
    Ranges are checked on construction: a negative penalty or KL weight would reward what it
    should punish."""

    objective: Objective = "differential"  # differential (MAGE) | cumulative (LaMer) | single_episode (plain RL)
    gamma_step: Discount = 0.95  # discount inside an episode
    gamma_traj: Discount = 0.6  # discount across an episode boundary
    invalid_penalty: NonNegative = 0.5  # c_inv per invalid call (authors' Kuhn script: 2.0)
    length_penalty: NonNegative = 2.0  # c_len (games 2.0, Sokoban 1.0)
    max_response_tokens: Annotated[int, Field(ge=1)] = 256  # L_max of the length penalty (the sampling limit)
    estimator: Estimator = "gigpo"
    anchor: Anchor = "global"  # episode index part of the step anchor (local) or not (global)
    norm: Norm = "mean_norm"
    norm_scope: NormScope = "group"  # group: per (seed, seat, opponent); opponent: per opponent over the batch
    # pooled: the episode term's mean (and std) over every call of the scope (MAGE-SPEC); per_episode:
    # over the scope's calls of the same episode number, a baseline that depends on the episode
    episode_baseline: EpisodeBaseline = "pooled"
    # stationary: a group's meta-episodes face one opponent; mixed: the paper's ablation, a group's
    # members face opponents drawn across the population (same initial state and seat)
    grouping: Grouping = "stationary"
    step_weight: NonNegative = 1.0  # w in A = A_ep + w * A_step
    # Scales the negative advantages, after A = A_ep + w * A_step: 1 is the method's; below 1 the
    # update leans on the calls that did better than their baseline (0: positive advantages only,
    # akin to self-imitation's (R - V)+ without its replay buffer), for a policy that rarely
    # succeeds (mage/algo/advantages.py)
    negative_weight: Annotated[float, Field(ge=0, le=1)] = 1.0
    epsilon: Annotated[float, Field(gt=0, le=1)] = 1e-6
    # PPO (MAGE-SPEC section 5)
    clip_ratio: Annotated[float, Field(gt=0, le=1)] = 0.2
    dual_clip: Annotated[float, Field(gt=1)] = 3.0
    kl_coef: NonNegative = 0.1
    entropy_coef: NonNegative = 0.001
