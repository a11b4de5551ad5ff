"""Ground-floor helpers shared by the backends, the trainer and the build: torch dtypes and
devices by name, the common prefix of token sequences, seeds derived from integers, and a
model's teacher-forced log-probs of tokens (what a backend's and the trainer's are checked on),
and the same log-probs with the work that sequences share done once (reading a policy)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: ``model.dtype`` names (mage.config.sections.Dtype) to torch dtypes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    """``model.device``: ``auto`` (or None) is the GPU where there is one, else the CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every sequence shares."""
    first, length = sequences[0], min(len(s) for s in sequences)
    for i in range(length):
        if any(s[i] != first[i] for s in sequences):
            return i
    return length


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integer parts (numpy's SeedSequence: well mixed, reproducible)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)


@torch.no_grad()
def teacher_forced(model: Any, tokens: Sequence[Sequence[int]], scored: Sequence[int],
                   autocast: contextlib.AbstractContextManager | None = None) -> list[list[float]]:
    """The model's log-probs (temperature 1) of the last ``scored[i]`` tokens of each
    ``tokens[i]``, each given the tokens before it, one sequence at a time (no padding), in
    eval mode (no dropout; the mode is restored after)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for sequence, n in zip(tokens, scored, strict=True):
            ids = torch.tensor([list(sequence)], device=device)
            with autocast if autocast is not None else contextlib.nullcontext():
                logits = model(input_ids=ids).logits[0, -n - 1:-1]
            out.append(logits.float().log_softmax(-1).gather(-1, ids[0, -n:, None])[:, 0].tolist())
    finally:
        model.train(was_training)
    return out


@torch.no_grad()
def teacher_forced_shared(model: Any, tokens: Sequence[Sequence[int]], scored: Sequence[int],
                          autocast: contextlib.AbstractContextManager | None = None) -> list[list[float]]:
    """:func:`teacher_forced`'s log-probs (equal up to rounding), the work the sequences share done
    once: the tokens before the scored ones (a sequence's context: a prompt) are run once per
    distinct context, the prefix every context shares (a game's rules) once for all, through the
    KV cache; the scored tokens of one context (the legal replies at one information state) go in
    one batch, right-padded, which a causal mask keeps from what comes before. Reading a policy at
    Leduc Poker's 936 information states scores 2,184 replies of 7 tokens after prompts of about
    400, most of them the rules (BENCHMARKS.md, "Exact exploitability: its cost per game")."""
    if not tokens:
        return []
    contexts = [tuple(sequence[:len(sequence) - n]) for sequence, n in zip(tokens, scored, strict=True)]
    if any(n < 1 for n in scored) or any(not context for context in contexts):
        raise ValueError("every sequence needs at least one scored token after at least one token of context")
    members: dict[tuple[int, ...], list[int]] = {}
    for i, context in enumerate(contexts):
        members.setdefault(context, []).append(i)
    # every context keeps a token past the shared prefix: its last position's logits score its first reply token
    shared = min(common_prefix_length(list(members)), min(len(c) for c in members) - 1)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[list[float]] = [[] for _ in tokens]
    try:
        with autocast if autocast is not None else contextlib.nullcontext():
            prefix = None
            if shared:
                first = next(iter(members))
                prefix = model(input_ids=torch.tensor([first[:shared]], device=device), use_cache=True).past_key_values
            for context, rows in members.items():
                cache = copy.deepcopy(prefix) if prefix is not None else None
                head = model(input_ids=torch.tensor([context[shared:]], device=device), past_key_values=cache, use_cache=True)
                replies = [list(tokens[i][len(context):]) for i in rows]
                longest = max(len(r) for r in replies)
                logits = head.logits[:, -1:].expand(len(rows), 1, -1)
                if longest > 1:
                    cache = head.past_key_values
                    cache.batch_repeat_interleave(len(rows))
                    # a reply's last token is scored, never fed: the pad (token 0) after a shorter
                    # reply is seen only by positions after it, which are not read
                    fed = torch.tensor([r[:-1] + [0] * (longest - len(r)) for r in replies], device=device)
                    logits = torch.cat([logits, model(input_ids=fed, past_key_values=cache, use_cache=True).logits], dim=1)
                logprobs = logits.float().log_softmax(-1)
                for j, (i, reply) in enumerate(zip(rows, replies, strict=True)):
                    out[i] = logprobs[j, torch.arange(len(reply), device=device), torch.tensor(reply, device=device)].tolist()
    finally:
        model.train(was_training)
    return out
