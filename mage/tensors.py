"""Ground-floor helpers shared by the backends, the trainer and the build: torch dtypes and
devices by name, the common prefix of token sequences, and seeds derived from integers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: ``model.dtype`` names (mage.sections.Dtype) to torch dtypes.
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
