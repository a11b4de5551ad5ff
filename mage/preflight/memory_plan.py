"""The memory plan: what a configuration needs on its device, part by part, before any work.

``python -m mage plan [overrides]`` prints it; every flow checks it when it starts
(:func:`check_fits`) and refuses a configuration that cannot fit its GPU, naming the key to
change. The figures are estimates from the model's shape (its ``config.json``, or the
published shape of a preset's model before it is fetched: :mod:`mage.models.shapes`) and the
settings, at the peak of one update:

* the trainer's persistent state: the weights (frozen ones in ``model.dtype``; trained ones,
  full fine-tuning's master weights or LoRA's adapters, in float32), full fine-tuning's
  ``model.dtype`` copy that autocast makes for the forward pass, float32 gradients, and
  AdamW's two float32 moments;
* activations of a micro-batch of ``train.micro_batch_tokens`` tokens: what a Qwen-style
  decoder layer keeps for the backward pass per token (norm inputs in float32, projections,
  rotary inputs, attention output, the MLP's four intermediate tensors), for every layer, or,
  with ``train.gradient_checkpointing``, each layer's input plus one layer's worth;
* the logits: two float32 [chunk x vocabulary] buffers with ``train.logits_chunk_tokens``
  (:mod:`mage.trainer.logprobs`), and, where the output layer is trained, its ``model.dtype``
  copy and its float32 gradient for one chunk; else about six float32 copies per response
  token of the micro-batch (``benchmarks/train_memory.py`` measures both);
* the rollout engine: vLLM's share of the GPU (``engine.vllm.gpu_memory_utilization``;
  with ``sleep_mode`` it is released during the update), or the hf backend's KV cache for a
  batch of ``engine.hf.batch_size`` sequences at the prompt and reply limits (an upper bound:
  every row at both limits); on a Ray runner the engines are the workers', not counted here;
* a fixed allowance for the CUDA context and workspaces.

With ``train.workers`` N > 1 (Ray Train workers, :mod:`mage.preflight.placement`) the plan is per GPU
(:func:`gpu_plans`): each update worker's GPU holds, with ``train.sharding=fsdp``, a 1/N shard of
the weights, of the trained ones' gradients and of AdamW's moments, and what FSDP2 gathers whole
at once (the root, embeddings with the output layer, for the whole pass, and two decoder layers,
the next one prefetched; in the dtype the shards hold: float32 for full fine-tuning) with float32
gradients before their reduce-scatter, in place of the autocast copy; with ``ddp`` all of it
is replicated. Activations and logits are one worker's micro-batch, as in one process. Each
engine's GPU (``flow.runner=ray``) holds vLLM's share, or the hf backend's weights and KV cache,
per engine on it; with ``flow.placement=colocated`` the engine's parts sit on the update worker's
GPU, asleep during the update. Every GPU is assumed to have the capacity the check is given.

This module imports no torch: :func:`device_capacity` does, when it is asked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mage.models.shapes import SHAPES
from mage.preflight.placement import placement
from mage.settings import Settings, SettingsError

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: The CUDA context, cuBLAS/attention workspaces and the allocator's fragmentation.
ALLOWANCE = 2 * GIB
#: float32 copies per response token's logits without chunking (logits, log-softmax, softmax,
#: their product and the gradient): benchmarks/train_memory.py measures about 5.7 on a CPU.
WHOLE_LOGITS_COPIES = 6
#: What vLLM keeps on the GPU while it sleeps (level 1: weights offloaded, KV cache dropped).
ASLEEP = 1 * GIB


class MemoryPlanError(SettingsError):
    """A configuration that cannot fit its device (or whose model's shape is unknown)."""


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape, as a Qwen2/Qwen3 ``config.json`` gives it."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(vocab=int(config["vocab_size"]), hidden=hidden, layers=int(config["num_hidden_layers"]),
                   heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config["intermediate_size"]), tied=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)))

    def linears(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linear layers by peft's module names: (inputs, outputs)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    def parameters(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = sum(i * o for i, o in self.linears().values()) + 2 * self.hidden
        layer += (q + 2 * kv) if self.qkv_bias else 2 * self.head_dim  # Qwen2's biases, or Qwen3's q/k norms
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * layer + self.hidden

    def embedding_parameters(self) -> int:
        """The embeddings, the output layer (when it is not tied to them) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def layer_parameters(self) -> int:
        """One decoder layer."""
        return (self.parameters() - self.embedding_parameters()) // self.layers

    def lora_parameters(self, r: int, targets: tuple[str, ...] | str) -> int:
        linears = self.linears()
        names = linears if targets == "all-linear" else ([targets] if isinstance(targets, str) else targets)
        return self.layers * sum(r * sum(linears[name]) for name in names if name in linears)

    def activation_bytes(self, dtype_bytes: int) -> int:
        """What one decoder layer keeps for the backward pass, per token."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = 2 * self.hidden * (4 + dtype_bytes)  # two RMSNorms: the float32 input and the output
        attention = dtype_bytes * (3 * q + 3 * kv)  # q, k before and after rotary, v, the attention output
        return norms + attention + 4 * self.intermediate * dtype_bytes  # gate, SiLU, up, their product


def model_shape(settings: Settings) -> Shape:
    """The shape of ``model.path``: from its ``config.json`` where the model is on this machine,
    else the published shape of a preset's model, else the tiny preset's build settings."""
    model = settings.model
    for directory in (model.path, model.local_dir):
        if directory and (Path(directory) / "config.json").is_file():
            return Shape.of(json.loads((Path(directory) / "config.json").read_text()))
    if model.path in SHAPES:
        return Shape.of(SHAPES[model.path])
    if model.build == "tiny" and model.tiny is not None:
        tiny = model.tiny
        return Shape(vocab=tiny.vocab_size, hidden=tiny.hidden_size, layers=tiny.num_layers, heads=tiny.num_heads,
                     kv_heads=tiny.num_kv_heads, head_dim=tiny.hidden_size // tiny.num_heads,
                     intermediate=tiny.intermediate_size, tied=True, qkv_bias=True)
    raise MemoryPlanError(f"model.path: the shape of {model.path!r} is unknown until it is fetched "
                          "(`python -m flows prepare_model`); the memory plan reads its config.json")


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    key: str  # the setting that changes it most
    during: str  # "update", "rollout" or "always"


@dataclass(frozen=True)
class MemoryPlan:
    """The parts of a configuration's memory on its device, and whether they fit ``capacity``."""

    parts: tuple[Part, ...]
    capacity: int | None
    device: str
    checkpoint_bytes: int  # one checkpoint on disk: trained weights and the optimizer
    host_bytes: int  # full fine-tuning's KL reference, in host memory (per update worker)
    notes: tuple[str, ...]
    role: str = ""  # whose GPU (gpu_plans): "" for the update's single device
    count: int = 1  # GPUs with this plan

    def total(self, during: str) -> int:
        return sum(p.bytes for p in self.parts if p.during in ("always", during))

    @property
    def peak(self) -> int:
        return max(self.total("update"), self.total("rollout"))

    def overflow(self) -> Part | None:
        """The largest part of the phase that does not fit ``capacity`` (None: it fits)."""
        if self.capacity is None:
            return None
        for during in ("update", "rollout"):
            if self.total(during) > self.capacity:
                return max((p for p in self.parts if p.during in ("always", during)), key=lambda p: p.bytes)
        return None

    def table(self) -> str:
        gib = lambda n: f"{n / GIB:.2f}"  # noqa: E731
        whose = f" of {self.role}" + (f" (x{self.count})" if self.count > 1 else "") if self.role else ""
        lines = [f"memory plan{whose} on {self.device}" + (f" ({gib(self.capacity)} GiB)" if self.capacity else ""),
                 "", "| part | GiB | when | the key that changes it |", "|---|---|---|---|"]
        lines += [f"| {p.name} | {gib(p.bytes)} | {p.during} | {p.key} |" for p in self.parts]
        lines += ["", f"peak during the update: {gib(self.total('update'))} GiB; during rollouts: "
                      f"{gib(self.total('rollout'))} GiB"]
        if self.checkpoint_bytes:
            lines.append(f"one checkpoint on disk: {gib(self.checkpoint_bytes)} GiB (trained weights and optimizer "
                         "state)")
        if self.host_bytes:
            per = " per update worker" if self.role.startswith("each update worker") else ""
            lines.append(f"host memory for the KL reference{per} (the starting weights, and the current ones during "
                         f"its pass): {gib(self.host_bytes)} GiB")
        lines += list(self.notes)
        return "\n".join(lines)


def plan(settings: Settings, capacity: int | None = None, device: str = "cuda") -> MemoryPlan:
    """The memory plan of the update's device of ``capacity`` bytes (None: unknown): the flow's
    process with ``train.workers=1``, else each update worker's GPU (its shard of the update's
    state, :mod:`mage.preflight.placement`)."""
    shape, model, train, engine = model_shape(settings), settings.model, settings.train, settings.engine
    where = placement(settings)
    workers = max(where.workers, 1)
    sharded = workers > 1 and train.sharding == "fsdp"
    share = (lambda n: -(-n // workers)) if sharded else (lambda n: n)  # FSDP pads each shard up
    of = f", a 1/{workers} shard" if sharded else ""
    key = "train.workers" if sharded else ""  # what changes a shard most
    dt = DTYPE_BYTES[model.dtype]
    total = shape.parameters()
    lora = model.lora
    trained = shape.lora_parameters(lora.r, lora.target_modules) if lora else total
    parts = []
    if lora:
        parts.append(Part(f"frozen weights ({model.dtype}){of}", share(total * dt), key or "model.path", "always"))
        parts.append(Part(f"LoRA r={lora.r} adapters (float32){of}", share(trained * 4), key or "model.lora.r", "always"))
    else:
        parts.append(Part(f"master weights (float32){of}", share(total * 4), key or "model.lora", "always"))
        if dt != 4 and not sharded:
            parts.append(Part(f"{model.dtype} copy for the forward pass (autocast)", total * dt, "model.lora", "update"))
    if sharded:
        # FSDP2 gathers what the shards hold (full fine-tuning's float32 masters, LoRA's frozen
        # weights in model.dtype): the root (embeddings, final norm, output layer) for the whole
        # pass, and a decoder layer with the next one prefetched; gradients of the gathered trained
        # weights in float32 until their reduce-scatter
        held = dt if lora else 4
        layer_trained = trained // shape.layers if lora else shape.layer_parameters()
        root_trained = 0 if lora else shape.embedding_parameters()
        unit = ((shape.embedding_parameters() + 2 * shape.layer_parameters()) * held
                + (root_trained + layer_trained) * 4)
        parts.append(Part("gathered (the root and two decoder layers), with float32 gradients", unit,
                          "train.sharding", "update"))
    parts.append(Part(f"gradients (float32){of}", share(trained * 4), key or "model.lora", "update"))
    parts.append(Part(f"AdamW moments (float32){of}", share(trained * 8), key or "model.lora", "always"))
    tokens = train.micro_batch_tokens if train.batching == "bucketed" else train.micro_batch_rows * (
        engine.max_prompt_tokens + engine.sampling.max_new_tokens)
    per_layer = shape.activation_bytes(dt)
    every_layer = tokens * per_layer * shape.layers
    checkpointed = tokens * (shape.hidden * dt * shape.layers + per_layer)
    notes = [f"activations at {tokens} tokens per micro-batch: {every_layer / GIB:.2f} GiB without gradient "
             f"checkpointing, {checkpointed / GIB:.2f} GiB with it"]
    if train.gradient_checkpointing:
        parts.append(Part(f"activations, {tokens} tokens, checkpointed", checkpointed, "train.micro_batch_tokens", "update"))
    else:
        parts.append(Part(f"activations, {tokens} tokens", every_layer, "train.gradient_checkpointing", "update"))
    chunk = train.logits_chunk_tokens
    if chunk is not None:
        parts.append(Part(f"logits, chunks of {chunk} tokens", 2 * min(chunk, tokens) * shape.vocab * 4,
                          "train.logits_chunk_tokens", "update"))
        if not lora:  # a trained output layer: its model.dtype copy per chunk, and its gradient's
            head = shape.vocab * shape.hidden * ((dt if dt != 4 else 0) + 4)
            parts.append(Part("output layer's copy and gradient, per chunk", head, "model.lora", "update"))
    else:
        parts.append(Part(f"logits of {tokens} tokens, unchunked", WHOLE_LOGITS_COPIES * tokens * shape.vocab * 4,
                          "train.logits_chunk_tokens", "update"))
    if where.workers:
        notes.append(f"train.workers={workers} ({train.sharding}, flow.placement={where.placement}): "
                     + ("the engines share these GPUs, asleep during the update" if where.placement == "colocated"
                        else "the engines run on GPUs of their own"))
        if where.placement == "colocated":
            beside = min(where.engines_per_gpu, -(-where.engines_at_once // max(where.worker_gpus_total, 1)))
            parts += _engine_parts(settings, shape, capacity, beside, asleep=True)
    elif settings.flow.runner == "ray":
        notes.append("flow.runner=ray: the rollouts' engines run on the cluster's workers, not beside the trainer")
    elif engine.backend == "vllm":
        parts += _engine_parts(settings, shape, capacity, 1, asleep=engine.vllm.sleep_mode)
    elif engine.backend == "hf":
        length = engine.max_prompt_tokens + engine.sampling.max_new_tokens
        kv = engine.hf.batch_size * length * 2 * shape.layers * shape.kv_heads * shape.head_dim * (4 if not lora else dt)
        parts.append(Part(f"hf KV cache, {engine.hf.batch_size} x {length} tokens", kv, "engine.hf.batch_size", "rollout"))
    if engine.backend == "vllm" and any(p.name.startswith("vLLM") and not p.bytes for p in parts):
        notes.append("vLLM's share is a fraction of the GPU: unknown without one")
    parts.append(Part("CUDA context and workspaces (allowance)", ALLOWANCE, "-", "always"))
    checkpoint = trained * 4 + trained * 8
    # the starting weights, and the current ones while the reference pass runs
    host = share(2 * total * 4) if (not lora and settings.algo.kl_coef) else 0
    role = "each update worker's GPU" if where.workers else ""
    return MemoryPlan(tuple(parts), capacity, device, checkpoint, host, tuple(notes), role,
                      where.worker_gpus_total if where.workers else 1)


def _vllm_share(settings: Settings, shape: Shape, capacity: int | None) -> int:
    """One vLLM engine's memory: its weights and fixed KV cache, or its share of the GPU."""
    vllm = settings.engine.vllm
    if vllm.kv_cache_memory_bytes is not None:
        return shape.parameters() * DTYPE_BYTES[settings.model.dtype] + vllm.kv_cache_memory_bytes
    return int(vllm.gpu_memory_utilization * capacity) if capacity else 0


def _engine_parts(settings: Settings, shape: Shape, capacity: int | None, engines: int, asleep: bool) -> list[Part]:
    """``engines`` vLLM engines on one GPU: awake during rollouts and asleep during the update
    with sleep mode (``asleep``), else all the time."""
    each = _vllm_share(settings, shape, capacity)
    times = f" x{engines}" if engines > 1 else ""
    if asleep:
        return [Part(f"vLLM engine{times}, awake", engines * each, "engine.vllm.gpu_memory_utilization", "rollout"),
                Part(f"vLLM engine{times}, asleep", engines * ASLEEP, "engine.vllm.sleep_mode", "update")]
    return [Part(f"vLLM engine{times}", engines * each, "engine.vllm.gpu_memory_utilization", "always")]


def engine_plan(settings: Settings, capacity: int | None = None, device: str = "cuda",
                count: int = 1) -> MemoryPlan | None:
    """The plan of a GPU of the Ray cluster's rollout engines (``flow.ray.shard_gpus``; fractions
    put several on one GPU), for ``count`` such GPUs; None where the engines take no GPU."""
    where, engine, model = placement(settings), settings.engine, settings.model
    if not where.engines or not where.shard_gpus or engine.backend == "scripted":
        return None
    shape = model_shape(settings)
    on_one = where.engines_per_gpu if where.shard_gpus < 1 else 1
    times = f" x{on_one}" if on_one > 1 else ""
    notes = [f"{on_one} engine(s) of flow.ray.shard_gpus={where.shard_gpus:g} on each GPU"]
    if engine.backend == "vllm":
        parts = [*_engine_parts(settings, shape, capacity, on_one, asleep=False)]
        if not parts[0].bytes:
            notes.append("vLLM's share is a fraction of the GPU: unknown without one")
    else:  # hf: the policy it samples (float32 full weights, or frozen weights and an adapter) and its KV cache
        dt, lora = DTYPE_BYTES[model.dtype], model.lora
        weights = shape.parameters() * dt + shape.lora_parameters(lora.r, lora.target_modules) * 4 if lora \
            else shape.parameters() * 4
        length = engine.max_prompt_tokens + engine.sampling.max_new_tokens
        kv = engine.hf.batch_size * length * 2 * shape.layers * shape.kv_heads * shape.head_dim * (4 if not lora else dt)
        parts = [Part(f"hf policy weights{times}", on_one * weights, "model.lora", "always"),
                 Part(f"hf KV cache{times}, {engine.hf.batch_size} x {length} tokens", on_one * kv,
                      "engine.hf.batch_size", "always"),
                 Part("CUDA context and workspaces (allowance)", ALLOWANCE, "-", "always")]
    return MemoryPlan(tuple(parts), capacity, device, 0, 0, tuple(notes), "each engine's GPU", count)


def gpu_plans(settings: Settings, capacity: int | None = None, device: str = "cuda") -> tuple[MemoryPlan, ...]:
    """Every GPU's plan: the update's (:func:`plan`: the flow's process, or each update worker's
    GPU) first, then, on a Ray runner, each engine's GPU where the engines have GPUs of their own
    (every engine's with ``flow.placement=split``; with ``colocated``, those beyond the update
    workers' GPUs)."""
    where = placement(settings)
    plans = [plan(settings, capacity, device)]
    alone = where.engine_gpus_total - (where.worker_gpus_total if where.placement == "colocated" else 0)
    if alone > 0 and (engines := engine_plan(settings, capacity, device, alone)) is not None:
        plans.append(engines)
    return tuple(plans)


def device_capacity(settings: Settings) -> tuple[str, int | None]:
    """The device ``model.device`` names and its memory in bytes (None: a CPU, not planned)."""
    import torch

    from mage.tensors import resolve_device

    device = resolve_device(settings.model.device)
    if device.type != "cuda":
        return str(device), None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_name(index), int(torch.cuda.get_device_properties(index).total_memory)


def check_fits(settings: Settings, capacity: int | None = None, device: str | None = None) -> MemoryPlan | None:
    """Refuse ``settings`` if a GPU's plan (:func:`gpu_plans`) cannot fit the device (default:
    ``model.device``'s; every GPU of a cluster is taken to be alike), with the key to change; the
    update's plan, or None on a CPU (host memory is not planned) or for a model whose shape is not
    known before it is fetched (a WARNING says so)."""
    if capacity is None:
        device, capacity = device_capacity(settings)
        if capacity is None:
            return None
    try:
        model_shape(settings)
    except MemoryPlanError as error:  # a hub model not fetched yet: the pipeline fetches it first
        logging.getLogger(__name__).warning(f"no memory plan: {error}")
        return None
    plans = gpu_plans(settings, capacity, device or "cuda")
    if settings.train.workers > 1 and not settings.train.worker_gpus:
        plans = plans[1:]  # the update's workers are CPU workers (gloo): not planned
    for memory in plans:
        part = memory.overflow()
        if part is not None:
            during = "update" if memory.total("update") > capacity else "rollout"
            on = f"{memory.role} ({memory.device})" if memory.role else memory.device
            raise MemoryPlanError(
                f"{part.key}: the plan needs {memory.total(during) / GIB:.1f} GiB during the {during} on {on} "
                f"({capacity / GIB:.1f} GiB); its largest part is {part.name} ({part.bytes / GIB:.1f} GiB): change "
                f"{part.key} (`python -m mage plan` with the same overrides prints every part)")
    return plans[0] if plans else None
