"""Typed, validated settings from the composed Hydra tree.

``Settings.from_config(cfg)`` turns every section of ``params/`` into its dataclass
(``RolloutConfig``, ``AlgoConfig``, ``TrainConfig``, ...). A key that a section does not
know, or a value it does not allow, raises :class:`SettingsError` naming the key and the
allowed keys or values, before any work starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mage.algo.config import AlgoConfig
from mage.backends.base import SamplingSettings
from mage.rollout.engine import RolloutConfig
from mage.train.config import LoraSettings, TrainConfig


class SettingsError(ValueError):
    """A configuration key or value is not allowed."""


def plain(value: Any) -> Any:
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def build(kind: type, section: Mapping[str, Any] | None, where: str, **extra: Any) -> Any:
    """Instantiate dataclass ``kind`` from ``section``; unknown keys and bad values raise."""
    values = dict(plain(section) or {}) | extra
    allowed = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {unknown}; allowed keys: {allowed}")
    try:
        return kind(**values)
    except (TypeError, ValueError) as error:
        message = str(error)
        # Messages from __post_init__ name the key as 'section.key'; point at the full path.
        raise SettingsError(f"{where}: {message}") from None


@dataclass(frozen=True)
class TinyBuild:
    """How the local ``tiny`` preset is built (tokenizer, architecture, behaviour cloning)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    seed: int = 0
    corpus_meta_episodes: int = 256  # scripted meta-episodes per game for the tokenizer corpus
    bc_games: tuple[str, ...] = ("kuhn_poker",)
    bc_rules: tuple[str, ...] = ("random",)  # scripted players the warm start imitates
    bc_meta_episodes: int = 512  # per game
    bc_epochs: int = 2
    bc_learning_rate: float = 1e-3
    bc_batch_rows: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "bc_games", tuple(self.bc_games))
        object.__setattr__(self, "bc_rules", tuple(self.bc_rules))
        if self.vocab_size < 512:
            raise ValueError("model.tiny.vocab_size must be >= 512")


@dataclass(frozen=True)
class ModelConfig:
    """A model preset (``params/model``): where the weights come from and how they train."""

    name: str
    path: str  # a hub id or a local directory (the tiny preset: where it is built)
    build: str | None = None  # "tiny": built locally by mage.models.tiny; None: loaded as is
    dtype: str = "float32"
    device: str = "auto"
    chat: bool = True
    enable_thinking: bool | None = None
    lora: LoraSettings | None = None
    tiny: TinyBuild | None = None

    def __post_init__(self) -> None:
        if self.build not in (None, "tiny"):
            raise ValueError(f"model.build must be null or 'tiny', got {self.build!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype must be one of ['bfloat16', 'float16', 'float32'], got {self.dtype!r}")


@dataclass(frozen=True)
class EngineConfig:
    """``params/engine``: the rollout engine, its backend and the training sampling."""

    rollout: RolloutConfig
    groups: int
    backend: str
    backend_options: dict[str, Any]
    sampling: SamplingSettings


@dataclass(frozen=True)
class Settings:
    game: dict[str, Any]
    engine: EngineConfig
    model: ModelConfig
    algo: AlgoConfig
    train: TrainConfig
    seed: int
    paths: dict[str, Any]
    run_name: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping[str, Any]) -> Settings:
        raw = plain(cfg)
        engine = dict(raw.get("engine") or {})
        backend = engine.pop("backend", "hf")
        backends = ("hf", "vllm", "scripted")
        if backend not in backends:
            raise SettingsError(f"engine.backend: must be one of {list(backends)}, got {backend!r}")
        options = {name: engine.pop(name, None) or {} for name in backends}
        groups = engine.pop("groups", 16)
        sampling = build(SamplingSettings, engine.pop("sampling", {}), "engine.sampling")
        rollout = build(RolloutConfig, engine, "engine")
        model_raw = dict(raw.get("model") or {})
        lora = model_raw.pop("lora", None)
        tiny = model_raw.pop("tiny", None)
        model = build(
            ModelConfig,
            model_raw,
            "model",
            lora=build(LoraSettings, lora, "model.lora") if lora else None,
            tiny=build(TinyBuild, tiny, "model.tiny") if tiny else None,
        )
        algo_raw = dict(raw.get("algo") or {})
        algo_raw.pop("name", None)
        algo_raw.setdefault("max_response_tokens", sampling.max_new_tokens)
        return cls(
            game=raw["game"],
            engine=EngineConfig(rollout, int(groups), backend, options[backend], sampling),
            model=model,
            algo=build(AlgoConfig, algo_raw, "algo"),
            train=build(TrainConfig, raw.get("train"), "train"),
            seed=int(raw.get("seed", 0)),
            paths=raw.get("paths") or {},
            run_name=str((raw.get("run") or {}).get("name", "default")),
            raw=raw,
        )

    def section_hash(self, *sections: str) -> str:
        """Stable hash of some sections of the raw config (what a cached result depends on)."""
        chosen = {name: self.raw.get(name) for name in sections} if sections else self.raw
        return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]
