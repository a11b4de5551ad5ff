"""New weights, and the check that a generator serves them, whatever the backend: the probe
(:class:`Probe`, a few token sequences cut from a rollout table), the encoding in which full
weights cross to another process without a file (:func:`encoded`, :func:`decoded`), and the
check of the log-probs served on the probe against the trainer's (:func:`check_gap`,
:class:`StaleWeightsError`). A backend's hooks (:meth:`mage.backends.base.Backend.take_weights`,
``check_weights``) use them; the vLLM engine's push is :mod:`mage.backends.vllm_sync`'s. This
module imports no backend and no trainer: the expected numbers come in as data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes of tensors per ``collective_rpc`` call (a msgpack binary holds at most 4 GiB).
CHUNK_BYTES = 512 << 20
#: Probe rows and their tokens, at most: enough to touch every weight, cheap to score twice.
PROBE_ROWS = 4
PROBE_TOKENS = 64
#: Largest log-prob gap (nats per token) between the engine and the trainer, by dtype. float32:
#: ten times the largest rounding gap measured (1.01e-4, vLLM's AVX-512 CPU kernels), far below
#: what stale weights give. 16-bit: vLLM's kernels and the trainer's autocast round differently;
#: not yet measured on a GPU.
TOLERANCES = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}


class StaleWeightsError(RuntimeError):
    """The vLLM engine does not serve the weights the trainer holds."""

    transient = False  # trying again serves the same weights


def tolerance_for(dtype: str, configured: float | None = None) -> float:
    """``engine.vllm.sync_tolerance`` if set, else :data:`TOLERANCES` of the engine's dtype."""
    if configured is not None:
        return float(configured)
    if dtype not in TOLERANCES:
        raise ValueError(f"no log-prob tolerance for dtype {dtype!r}: set engine.vllm.sync_tolerance")
    return TOLERANCES[dtype]


# -- the probe ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """Token sequences; the last ``scored[i]`` tokens of ``tokens[i]`` are compared."""

    tokens: tuple[tuple[int, ...], ...]
    scored: tuple[int, ...]

    def rows(self) -> tuple[list[list[int]], list[list[int]]]:
        """As prompt and response token ids (a trajectory table's two columns)."""
        return ([list(t[: len(t) - n]) for t, n in zip(self.tokens, self.scored)],
                [list(t[len(t) - n:]) for t, n in zip(self.tokens, self.scored)])


def probe_from(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], rows: int = PROBE_ROWS,
               tokens: int = PROBE_TOKENS) -> Probe:
    """The first ``rows`` rows with a response, each cut to its last ``tokens`` tokens of prompt
    and response (at least one of them prompt); the response's tokens in it are scored."""
    if tokens < 2:
        raise ValueError(f"a probe sequence needs at least 2 tokens, got {tokens}")
    picked = [(list(p), list(r)) for p, r in zip(prompts, responses) if r and p][:rows]
    if not picked:
        raise ValueError("no row with a prompt and a response to probe the engine with")
    cut = [tuple((p + r)[-tokens:]) for p, r in picked]
    return Probe(tuple(cut), tuple(min(len(r), len(c) - 1) for (_, r), c in zip(picked, cut)))



# -- the encoding ------------------------------------------------------------------------
#: One tensor as it crosses a process boundary: ``(name, dtype, shape, bytes)``.
Encoded = tuple[str, str, list[int], bytes]


def encoded(weights: Iterable[tuple[str, Any]], chunk_bytes: int = CHUNK_BYTES) -> Iterable[list[Encoded]]:
    """``(name, dtype, shape, bytes)`` of each tensor, in chunks of about ``chunk_bytes`` (what
    crosses to the engine's workers, or to a rollout worker in another process)."""
    import torch

    chunk: list[Encoded] = []
    size = 0
    for name, tensor in weights:
        t = tensor.detach().to("cpu").contiguous()
        data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        chunk.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), data))
        size += len(data)
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def decoded(chunks: Iterable[list[Encoded]]) -> Iterable[tuple[str, Any]]:
    """The ``(name, tensor)`` pairs of :func:`encoded`'s chunks (each tensor owns its memory)."""
    import torch

    for chunk in chunks:
        for name, dtype, shape, data in chunk:
            dt = getattr(torch, dtype)
            flat = torch.frombuffer(bytearray(data), dtype=dt) if data else torch.empty(0, dtype=dt)
            yield name, flat.view(shape)


# -- the check ---------------------------------------------------------------------------
def largest_gap(served: Sequence[Sequence[float]], expected: Sequence[Sequence[float]]) -> tuple[float, int, int]:
    """The largest ``|served - expected|`` and its row and token (NaN counts as infinite)."""
    worst = (-1.0, 0, 0)
    for r, (row, ref) in enumerate(zip(served, expected, strict=True)):
        if len(row) != len(ref):
            raise ValueError(f"probe row {r}: {len(row)} served log-probs against {len(ref)} expected")
        for t, (a, b) in enumerate(zip(row, ref)):
            gap = abs(a - b)
            gap = math.inf if math.isnan(gap) else gap
            if gap > worst[0]:
                worst = (gap, r, t)
    return worst


def check_gap(served: Sequence[Sequence[float]], expected: Sequence[Sequence[float]], tolerance: float,
              what: str = "the trainer's weights") -> float:
    """:func:`verify`'s check of log-probs already served (by any engine, or a policy in another process)."""
    gap, row, token = largest_gap(served, expected)
    if not gap <= tolerance:
        raise StaleWeightsError(
            f"the rollout engine does not serve {what}: its log-probs of the probe differ from the trainer's by up to "
            f"{gap:.3g} nats (probe row {row}, scored token {token}), above the tolerance {tolerance:g}. It would "
            "sample from a policy PPO does not score, so the run stops. If weights were pushed, the push did not "
            "reach every layer (engine.vllm.weight_sync=disk loads the checkpoint instead); if the gap is rounding "
            "(16-bit dtypes), raise engine.vllm.sync_tolerance")
    return gap
