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
"""

from __future__ import annotations

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
class LossParts:
    loss: torch.Tensor  # this micro-batch's share of the mini-batch token-mean
    policy: float
    kl: float
    entropy: float
    clip_fraction: float
    tokens: int


def ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: AlgoSection,
    total_tokens: int,
    entropy: torch.Tensor | None = None,
) -> LossParts:
    """PPO loss of one micro-batch; tensors are [rows, tokens], ``advantages`` is [rows]."""
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
