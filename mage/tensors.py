"""Ground-floor helpers shared by the backends, the trainer and the build: torch dtypes and
devices by name, the common prefix of token sequences, seeds derived from integers, and a
model's teacher-forced log-probs of tokens (what a backend's and the trainer's are checked on)."""

from __future__ import annotations

import contextlib
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
