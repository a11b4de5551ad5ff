r"""Token-level losses of the policy update (docs/method.md, The policy update), CleanRL-style.

For every response token t of call i, with advantage A_i broadcast over its tokens:

    ratio_t   = exp(log pi(t) - log pi_old(t))
    clipped   = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))        PPO clip
    pg_t      = min(clipped, -A * c)  if A < 0  else clipped              dual clip (c = 3)
    kl_t      = exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]  low_var_kl (k3)
    H_t       = entropy of pi at t
    loss_t    = pg_t + beta * kl_t - alpha * H_t

Aggregation is token-mean over the whole mini-batch: the sum over tokens divided by the
mini-batch's number of response tokens, so micro-batches accumulate to exactly the
mini-batch's mean whatever their sizes.

``algo.policy_loss`` names the loss, registered in :data:`POLICY_LOSSES` (as the objectives
and estimators are): ``ppo`` is the above; ``decoupled_ppo`` corrects it for replies sampled
from an older policy than the one the update starts from (``train.max_staleness``), with the
decoupled objective (Hilton et al. 2022; AReaL). pi_old is then the proximal policy (the
trainer's weights as the update starts, what the clip is taken around) and mu the behaviour
policy (the rollout's, its log-probs recorded in ``response_logprobs``):

    w_t       = min(exp(log pi_old(t) - log mu(t)), cap)   for a stale call; exactly 1 otherwise
    loss_t    = w_t * pg_t + beta * kl_t - alpha * H_t

with cap ``algo.behaviour_weight_cap``. A call is stale when its ``policy_version`` is below
the update's (the updates its weights had seen); with every call fresh, as at staleness 0,
``decoupled_ppo`` is ``ppo`` exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mage.config.sections import AlgoSection


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token], in float32 whatever the model's dtype."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(l) - sum softmax(l) * l, per position."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The k3 estimator of KL(pi || pi_ref): unbiased, non-negative, low variance.

    Where ``mask`` is 0 the log-ratio is taken as 0 *before* the exponential: a padded
    position's log-probs can be anything (-100 and a filler 0 give exp(100) = inf, and
    0 x inf is NaN in the backward pass even though the mask zeroes the loss there)."""
    log_ratio = ref_logprobs - logprobs
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(-10.0, 10.0)


@dataclass
class BehaviourWeights:
    """Sums over one micro-batch's stale reply tokens of the behaviour weights w_t (what the
    update's metrics are made of: their mean, spread and largest, and the truncated share), and
    its reply tokens (of which the stale share)."""

    total: float = 0.0  # sum of w_t over stale tokens
    squares: float = 0.0  # sum of w_t ** 2 over stale tokens
    largest: float = 0.0  # max w_t before the cap over stale tokens (0.0: none)
    truncated: int = 0  # stale tokens whose weight the cap cut
    stale: int = 0  # tokens of stale calls
    tokens: int = 0  # every reply token


@dataclass
class LossParts:
    loss: torch.Tensor  # this micro-batch's share of the mini-batch token-mean
    policy: float
    kl: float
    entropy: float
    clip_fraction: float
    tokens: int
    weights: BehaviourWeights | None = None  # decoupled_ppo's


#: ``loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, cfg, total_tokens, entropy,
#: behaviour_logprobs, stale)``: tensors [rows, tokens], ``advantages`` and ``stale`` [rows]
PolicyLoss = Callable[..., LossParts]

#: ``algo.policy_loss`` -> its loss
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register a policy loss under ``name`` (``algo.policy_loss``)."""

    def register(loss: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = loss
        return loss

    return register


def behaviour_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, stale: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """pi_old(t) / mu(t) at the reply tokens of stale rows, before the cap; exactly 1 elsewhere
    (the log-ratio is set to 0 before the exponential, as in :func:`low_var_kl`). Tensors
    [rows, tokens], ``stale`` [rows]; no gradient flows through it."""
    keep = mask.bool() & stale.bool().unsqueeze(-1)
    log_ratio = (old_logprobs - behaviour_logprobs).detach()
    return torch.exp(torch.where(keep, log_ratio, torch.zeros_like(log_ratio)))


@register_policy_loss("ppo")
def ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: AlgoSection,
    total_tokens: int,
    entropy: torch.Tensor | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    stale: torch.Tensor | None = None,
) -> LossParts:
    """PPO loss of one micro-batch; tensors are [rows, tokens], ``advantages`` is [rows]. The
    behaviour policy is not used: stale rows are trained on as if on-policy (uncorrected), every
    weight 1."""
    parts = _clipped_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, cfg, total_tokens, entropy)
    keep = mask.bool()
    stale_tokens = int((keep & stale.bool().unsqueeze(-1)).sum()) if stale is not None else 0
    parts.weights = BehaviourWeights(total=float(stale_tokens), squares=float(stale_tokens),
                                     largest=1.0 if stale_tokens else 0.0, stale=stale_tokens, tokens=int(keep.sum()))
    return parts


@register_policy_loss("decoupled_ppo")
def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: AlgoSection,
    total_tokens: int,
    entropy: torch.Tensor | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    stale: torch.Tensor | None = None,
) -> LossParts:
    """:func:`ppo_loss` with each stale row's policy term weighted by w_t (:func:`behaviour_weights`):
    the clip around the proximal policy ``old_logprobs``, the importance weight against the
    behaviour policy ``behaviour_logprobs``. Without stale rows it is :func:`ppo_loss`, bit for bit."""
    if stale is None or not bool(stale.any()):
        return ppo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, cfg, total_tokens, entropy, stale=stale)
    if behaviour_logprobs is None:
        raise ValueError("stale rows need the behaviour policy's log-probs (response_logprobs)")
    raw = behaviour_weights(old_logprobs, behaviour_logprobs, stale, mask)
    weight = raw.clamp(max=cfg.behaviour_weight_cap)
    parts = _clipped_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, cfg, total_tokens, entropy, weight)
    keep = mask.bool()
    on_stale = keep & stale.bool().unsqueeze(-1)
    kept, before = weight[on_stale], raw[on_stale]
    parts.weights = BehaviourWeights(total=float(kept.sum()), squares=float((kept * kept).sum()),
                                     largest=float(before.max()) if before.numel() else 0.0,
                                     truncated=int((before > cfg.behaviour_weight_cap).sum()),
                                     stale=int(on_stale.sum()), tokens=int(keep.sum()))
    return parts


def _clipped_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: AlgoSection,
    total_tokens: int,
    entropy: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> LossParts:
    keep = mask.bool()
    mask = mask.float()
    adv = advantages.unsqueeze(-1).to(logprobs.dtype)
    # Masked positions get ratio 1 before the exponential (see low_var_kl): their log-probs
    # are not a response token's, and an overflow there would poison the whole gradient.
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(torch.where(keep, log_ratio, torch.zeros_like(log_ratio)))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_ratio, 1.0 + cfg.clip_ratio)
    pg = torch.maximum(unclipped, clipped)
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip), pg)
    if weight is not None:
        pg = weight * pg
    per_token = pg
    kl = torch.zeros_like(pg)
    if ref_logprobs is not None and cfg.kl_coef:
        kl = low_var_kl(logprobs, ref_logprobs, keep)
        per_token = per_token + cfg.kl_coef * kl
    ent = torch.zeros_like(pg) if entropy is None else entropy
    if entropy is not None and cfg.entropy_coef:
        per_token = per_token - cfg.entropy_coef * ent
    loss = (per_token * mask).sum() / max(total_tokens, 1)
    n = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        clip_fraction = (((ratio - 1.0).abs() > cfg.clip_ratio).float() * mask).sum() / n
    return LossParts(
        loss=loss,
        policy=float((pg.detach() * mask).sum() / n),
        kl=float((kl.detach() * mask).sum() / n),
        entropy=float((ent.detach() * mask).sum() / n),
        clip_fraction=float(clip_fraction),
        tokens=int(mask.sum()),
    )
