"""Loading a policy: a causal LM and its tokenizer, from a hub id or a local directory.

The same ``from_pretrained`` path serves Qwen from the hub on a GPU machine and the
locally built ``tiny`` preset on a laptop. LoRA (peft) is added on top when configured,
or an existing adapter (a LoRA checkpoint) is loaded onto the base model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mage.train.config import LoraSettings

if TYPE_CHECKING:
    from mage.settings import Settings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Policy:
    model: Any  # a transformers model, or a peft model wrapping one
    tokenizer: Any
    source: str  # the base model: a hub id or a directory
    lora: LoraSettings | None = None

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_policy(
    source: str | Path,
    *,
    dtype: str = "float32",
    device: str | None = None,
    lora: LoraSettings | None = None,
    adapter: str | Path | None = None,
    trainable: bool = True,
) -> Policy:
    """Load ``source`` (hub id or directory); add a fresh LoRA or load ``adapter`` onto it."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    source = str(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:  # some hub tokenizers have none; reuse end of sequence
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype]).to(resolve_device(device))
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
        if lora is None:
            config = model.peft_config["default"]
            lora = LoraSettings(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                                target_modules=tuple(sorted(config.target_modules)))
    elif lora is not None:
        from peft import LoraConfig, get_peft_model

        targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
        model = get_peft_model(
            model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM")
        )
    if not trainable:
        model.requires_grad_(False)
    return Policy(model=model, tokenizer=tokenizer, source=source, lora=lora)


#: (model.path, differences) already warned about in this process.
_STALE_PRESETS_WARNED: set[tuple[str, str]] = set()


def ensure_model(settings: Settings, progress: bool = True) -> str:
    """The base model's local directory, made available: the tiny preset is built if missing;
    a hub model (``model.path`` is a hub id) is fetched into ``model.local_dir`` (or the hub
    cache) unless it is already there. Either way the result loads with ``from_pretrained``."""
    model = settings.model
    if model.build == "tiny":
        from mage.models.build import build_differences, build_tiny

        if not (Path(model.path) / "config.json").is_file():
            build_tiny(settings, progress=progress)
        elif differences := build_differences(model.path, model.tiny):
            # Kept, not rebuilt: a preset is also reused on purpose (one build for every game of a
            # smoke run, a preset copied in to skip its build). DVC's stage rebuilds on its own.
            changes = ", ".join(f"{key} {built!r} -> {asked!r}" for key, (built, asked) in differences.items())
            if (model.path, changes) not in _STALE_PRESETS_WARNED:  # the flows ask once per sub-flow
                _STALE_PRESETS_WARNED.add((model.path, changes))
                logging.getLogger(__name__).warning(
                    f"{model.path}: the tiny preset there was built with other model.tiny settings ({changes}); "
                    "it is used as it is. Remove the directory, or set model.path elsewhere, to build it anew.")
        return model.path
    if Path(model.path).is_dir():
        return model.path
    if model.local_dir and (Path(model.local_dir) / "config.json").is_file():
        return model.local_dir
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
    return snapshot_download(model.path, local_dir=model.local_dir, allow_patterns=patterns)
