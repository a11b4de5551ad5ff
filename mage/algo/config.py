"""Settings of returns, advantages and the PPO loss (``params/algo``)."""

from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("differential", "cumulative", "single_episode")
ESTIMATORS = ("gigpo", "grpo")
ANCHORS = ("global", "local")
NORMS = ("mean_norm", "mean_std_norm")
SCOPES = ("group", "opponent")


@dataclass(frozen=True)
class AlgoConfig:
    """MAGE-SPEC sections 3-5; defaults are the paper's (invalid penalty: the paper's 0.5)."""

    objective: str = "differential"  # differential (MAGE) | cumulative (LaMer) | single_episode (plain RL)
    gamma_step: float = 0.95  # discount inside an episode
    gamma_traj: float = 0.6  # discount across an episode boundary
    invalid_penalty: float = 0.5  # c_inv per invalid call (authors' Kuhn script: 2.0)
    length_penalty: float = 2.0  # c_len (games 2.0, Sokoban 1.0)
    max_response_tokens: int = 256  # L_max of the length penalty (the sampling limit)
    estimator: str = "gigpo"  # gigpo | grpo
    anchor: str = "global"  # global | local (episode index part of the step anchor)
    norm: str = "mean_norm"  # mean_norm | mean_std_norm
    norm_scope: str = "group"  # group: per (seed, seat, opponent); opponent: per opponent over the batch
    step_weight: float = 1.0  # w in A = A_ep + w * A_step
    epsilon: float = 1e-6
    # PPO (MAGE-SPEC section 5)
    clip_ratio: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.1
    entropy_coef: float = 0.001

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("objective", self.objective, OBJECTIVES),
            ("estimator", self.estimator, ESTIMATORS),
            ("anchor", self.anchor, ANCHORS),
            ("norm", self.norm, NORMS),
            ("norm_scope", self.norm_scope, SCOPES),
        ):
            if value not in allowed:
                raise ValueError(f"algo.{name} must be one of {allowed}, got {value!r}")
        if not (0 <= self.gamma_step <= 1 and 0 <= self.gamma_traj <= 1):
            raise ValueError("algo.gamma_step and algo.gamma_traj must be in [0, 1]")
        if self.max_response_tokens < 1:
            raise ValueError("algo.max_response_tokens must be >= 1")
        if self.dual_clip <= 1:
            raise ValueError("algo.dual_clip must be > 1")
