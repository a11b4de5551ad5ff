"""Log-probabilities and entropies of response tokens without a [rows x tokens x vocabulary]
tensor of logits.

A PPO update needs, per response token, ``log softmax(z)`` at the token and the entropy of
``softmax(z)``, where ``z = head(hidden) / T``. Holding every position's logits costs the
vocabulary times the tokens: Qwen's 151,936 entries x 3,072-token replies x 6 rows is 2.8 G
logits, 11 GB per float32 copy, and autograd keeps several. Here the output layer runs on the
decoder's hidden states of the response positions only, ``chunk_tokens`` positions at a time,
through :class:`_ChunkLogprobs`: its forward pass keeps, per token, only the log-normaliser
and the entropy, and its backward pass computes one chunk's logits again and turns them into
the gradient in place, with the closed forms

    d logprob / dz = onehot(target) - p,        d entropy / dz = -p * (log p + entropy).

So at most two [chunk x vocabulary] float32 buffers live at once, whatever the reply length.

Liger-Kernel's chunked losses do the same for the losses they define (its PPO/GRPO losses
fuse their own clipping and normalisers into the chunk loop, and give no entropy); MAGE's
loss stays one definition, in :mod:`mage.algo.losses`, fed by these log-probs and entropies.

The figures are those of the whole-logits computation (:func:`mage.algo.losses.token_logprobs`,
:func:`mage.algo.losses.entropy_from_logits`) up to the order of float sums:
``tests/test_trainer.py`` holds them, and the gradients, to 1e-5 in float32.
``benchmarks/train_memory.py`` measures the memory.
"""

from __future__ import annotations

import torch


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
            dtype: torch.dtype) -> torch.Tensor:
    """``head(hidden) / T`` in float32, the matrix product in ``dtype`` (as autocast runs it)."""
    z = hidden.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        z = z + bias.to(dtype)
    z = z.float()
    return z.div_(temperature) if temperature != 1.0 else z


class _ChunkLogprobs(torch.autograd.Function):
    """[C] log-probs of ``targets`` and [C] entropies under ``softmax(hidden @ weight.T / T)``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, dtype, with_entropy):
        log_p = _logits(hidden, weight, bias, temperature, dtype)
        normaliser = torch.logsumexp(log_p, dim=-1)
        log_p.sub_(normaliser.unsqueeze(-1))
        logprobs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -torch.einsum("cv,cv->c", log_p.exp(), log_p) if with_entropy else normaliser.new_zeros(0)
        ctx.save_for_backward(hidden, weight, bias, targets, normaliser, entropy)
        ctx.temperature, ctx.dtype = temperature, dtype
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, normaliser, entropy = ctx.saved_tensors
        log_p = _logits(hidden, weight, bias, ctx.temperature, ctx.dtype).sub_(normaliser.unsqueeze(-1))
        p = log_p.exp()
        grad = log_p  # the buffer becomes dLoss/dz, in place
        if grad_entropy is not None and entropy.numel():
            grad.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-grad_entropy.float().unsqueeze(-1))
        else:
            grad.zero_()
        if grad_logprobs is not None:
            g = grad_logprobs.float().unsqueeze(-1)
            grad.sub_(p.mul_(g))
            grad.scatter_add_(-1, targets.unsqueeze(-1), g)
        del p
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        grad = grad.to(ctx.dtype)
        grad_hidden = (grad @ weight.to(ctx.dtype)).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = (grad.t() @ hidden.to(ctx.dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def response_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    entropy: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, K] of ``targets`` [B, K] under ``softmax(head(hidden) / temperature)``, and
    entropies [B, K] with ``entropy``, at the positions where ``mask`` [B, K] is set (0
    elsewhere); ``hidden`` [B, K, H] holds the states that predict each target. ``head`` is
    a linear output layer; its product runs in ``dtype`` (the policy's compute dtype)."""
    if type(head) is not torch.nn.Linear:
        raise TypeError(f"the chunked log-probs need a plain linear output layer, got {type(head).__name__}; "
                        "set train.logits_chunk_tokens=null")
    index = mask.bool().nonzero(as_tuple=True)
    selected, wanted = hidden[index], targets[index]  # [N, H], [N]
    zeros = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    logprobs, entropies = [], []
    for start in range(0, selected.shape[0], chunk_tokens):
        lp, en = _ChunkLogprobs.apply(selected[start:start + chunk_tokens], head.weight, head.bias,
                                      wanted[start:start + chunk_tokens], float(temperature), dtype, entropy)
        logprobs.append(lp)
        entropies.append(en)
    if not logprobs:
        return zeros, (zeros.clone() if entropy else None)
    return (zeros.index_put(index, torch.cat(logprobs)),
            zeros.index_put(index, torch.cat(entropies)) if entropy else None)
