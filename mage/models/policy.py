"""Loading a policy: a causal LM and its tokenizer, from a hub id or a local directory, and
the backend that generates with it.

The same ``from_pretrained`` path serves Qwen from the hub on a GPU machine and the
locally built ``tiny`` preset on a laptop. LoRA (peft) is added on top when configured,
or an existing adapter (a LoRA checkpoint) is loaded onto the base model. Nothing here
builds or downloads a model: :func:`mage.warmstart.prepare_model` does, once, before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mage.backends import Backend, make_backend
from mage.config.sections import LoraSection
from mage.models import checkpoint as ckpt
from mage.models.checkpoint import Checkpoint
from mage.settings import Settings
from mage.tensors import DTYPES, resolve_device


@dataclass
class Policy:
    """A model, its tokenizer and how it computes.

    ``compute_dtype`` is ``model.dtype``: every forward pass computes in it. Weights that are
    trained are held in float32 whatever it is, and so is their optimizer state: full
    fine-tuning's (master weights: an AdamW step of 1e-6 on a bf16 weight of 0.02, whose
    spacing is 1.2e-4, would round to no change) and LoRA's adapters (peft keeps them in
    float32). Frozen weights (LoRA's base model, a policy loaded to generate or evaluate) are
    held in ``compute_dtype``."""

    model: Any  # a transformers model, or a peft model wrapping one
    tokenizer: Any
    source: str  # the base model: a hub id or a directory
    lora: LoraSection | None = None
    compute_dtype: torch.dtype = torch.float32

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def autocast(self) -> contextlib.AbstractContextManager:
        """Inside, a forward pass computes in ``compute_dtype`` (torch.autocast; nothing to
        do in float32)."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)


def load_policy(
    source: str | Path,
    *,
    dtype: str = "float32",
    device: str | None = None,
    lora: LoraSection | None = None,
    adapter: str | Path | None = None,
    trainable: bool = True,
) -> Policy:
    """Load ``source`` (hub id or directory); add a fresh LoRA or load ``adapter`` onto it.
    ``dtype`` is the compute dtype (:class:`Policy`): a full model that is ``trainable`` is
    held in float32, its master weights."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    source = str(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:  # some hub tokenizers have none; reuse end of sequence
        tokenizer.pad_token = tokenizer.eos_token
    full_training = trainable and lora is None and adapter is None
    held = torch.float32 if full_training else DTYPES[dtype]
    model = AutoModelForCausalLM.from_pretrained(source, dtype=held).to(resolve_device(device))
    return as_policy(model, tokenizer, source, dtype=dtype, lora=lora, adapter=adapter, trainable=trainable)


def as_policy(
    model: torch.nn.Module,
    tokenizer,
    source: str,
    *,
    dtype: str = "float32",
    lora: LoraSection | None = None,
    adapter: str | Path | None = None,
    trainable: bool = True,
) -> Policy:
    """A loaded causal LM (held in float32 for full training, else in ``dtype``) as a
    :class:`Policy`: with a fresh LoRA or ``adapter`` on it (:func:`load_policy`'s second half,
    for a model built in memory, as the benchmarks do)."""
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
        if lora is None:
            config = model.peft_config["default"]
            lora = LoraSection(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                                target_modules=tuple(sorted(config.target_modules)))
    elif lora is not None:
        from peft import LoraConfig, get_peft_model

        targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
        model = get_peft_model(
            model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM")
        )
    if not trainable:
        model.requires_grad_(False)
    return Policy(model=model, tokenizer=tokenizer, source=source, lora=lora, compute_dtype=DTYPES[dtype])


#: The files of a hub model that loading reads (what prepare_model fetches).
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


class ModelNotPreparedError(FileNotFoundError):
    """The base model is not on this machine yet (``prepare_model`` builds or fetches it)."""

    transient = False  # another try finds it missing again


def model_source(settings: Settings) -> str:
    """The base model's local directory, as :func:`mage.warmstart.prepare_model` left it. Loading
    never builds a preset or downloads: a model that is not there is a
    :class:`ModelNotPreparedError` saying how to prepare it."""
    model = settings.model
    prepare = ("prepare it first: `python -m flows prepare_model` (with the run's overrides), or "
               "mage.warmstart.prepare_model(settings) from Python")
    if model.build == "tiny" or Path(model.path).is_dir():
        if model.build != "tiny" or (Path(model.path) / "config.json").is_file():
            return model.path
        raise ModelNotPreparedError(f"{model.path}: the tiny preset is not built there; {prepare}")
    if model.local_dir and (Path(model.local_dir) / "config.json").is_file():
        return model.local_dir
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(model.path, allow_patterns=list(HUB_FILES), local_files_only=True)
    except LocalEntryNotFoundError:
        where = model.local_dir or "the hub cache"
        raise ModelNotPreparedError(f"{model.path}: not in {where}; {prepare}") from None


def load_run_policy(settings: Settings, checkpoint: Checkpoint | None = None, trainable: bool = True) -> Policy:
    """The policy of a run: the base model plus LoRA, with a checkpoint's weights if given."""
    model = settings.model
    policy = load_policy(model_source(settings), dtype=model.dtype, device=model.device, lora=model.lora,
                         trainable=trainable)
    if checkpoint is not None:
        ckpt.load_weights(policy, checkpoint)
    return policy


def lora_slots(settings: Settings) -> int:
    """The LoRA adapters a vLLM engine holds at once (``max_loras``, and its cache of adapters):
    two; with a league, the agent's and every snapshot's, so that no snapshot's adapter is read
    back from disk between the batches of one rollout step."""
    league = settings.population.league
    return max(2, 1 + league.max_size) if league.enabled else 2


def rollout_backend(settings: Settings, policy: Policy | None = None, checkpoint: Checkpoint | None = None) -> Backend:
    """A backend generating with the run's policy (``policy`` in memory, else ``checkpoint``,
    else the starting policy)."""
    engine, model = settings.engine, settings.model
    options = dict(engine.backend_options)
    if engine.backend == "hf":
        if policy is None:
            policy = load_run_policy(settings, checkpoint, trainable=False)
        # the trainer's policy in memory generates on its own weights: float32 master weights
        # under full fine-tuning (transformers' static KV cache takes one dtype, which mixed
        # autocast keys and values are not); a policy loaded to generate is held in model.dtype
        return make_backend("hf", model=policy.model, tokenizer=policy.tokenizer, chat=model.chat,
                            enable_thinking=model.enable_thinking, **options)
    if engine.backend == "vllm":
        # The process's engine (started once, on the base model): the checkpoint is the policy it serves.
        kind = checkpoint.kind if checkpoint is not None else None
        return make_backend("vllm", model=model_source(settings), dtype=model.dtype, chat=model.chat,
                            adapter=checkpoint.path if kind == "lora" else None,
                            weights=checkpoint.path if kind == "full" else None,
                            lora_rank=model.lora.r if model.lora is not None else None,
                            max_loras=lora_slots(settings), enable_thinking=model.enable_thinking,
                            seed=settings.seed, **options)
    # the scripted player's replies, tokenized as the model would: a run trains the model on them
    # (the scripted-backend lifecycle of every game; the warm start's transcripts go without)
    tokenizer = AutoTokenizer.from_pretrained(model_source(settings)) if policy is None else policy.tokenizer
    return make_backend("scripted", tokenizer=tokenizer, chat=model.chat, **options)
