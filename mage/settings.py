"""Typed, validated settings from the composed Hydra tree.

``load_settings(overrides)`` composes ``params/`` (or reads an already composed file such
as DVC's ``params.yaml``) and ``Settings.from_config(cfg)`` turns every section into its
dataclass (``RolloutConfig``, ``AlgoConfig``, ``TrainConfig``, ``EvalConfig``, ...). Types
are checked by pydantic against the dataclasses' annotations. A key that a section does not
know, a value of the wrong type or one it does not allow raises :class:`SettingsError`
naming the key and the allowed keys or values, before any work starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    from pydantic import TypeAdapter, ValidationError

    values = dict(plain(section) or {}) | extra
    allowed = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {unknown}; allowed keys: {allowed}")
    built = {k: v for k, v in values.items() if dataclasses.is_dataclass(v)}  # already validated
    try:
        checked = TypeAdapter(kind).validate_python({k: v for k, v in values.items() if k not in built})
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "value_error":  # from __post_init__: it names the key and allowed values
            raise SettingsError(f"{where}: {str(first['ctx']['error'])}") from None
        key = ".".join(str(part) for part in (where, *first["loc"]))
        raise SettingsError(f"{key}: {first['msg']} (got {first.get('input')!r})") from None
    return dataclasses.replace(checked, **built) if built else checked


@dataclass(frozen=True)
class TinyBuild:
    """How the local ``tiny`` preset is built (tokenizer, architecture, behaviour cloning).

    The behaviour-cloning settings are chosen per game (``params/model_game/tiny/<game>.yaml``)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    seed: int = 0
    corpus_meta_episodes: int = 256  # scripted meta-episodes per game for the tokenizer corpus
    # scripted players the warm start imitates: names or {rule: name, **params} (mage.backends.scripted)
    bc_rules: tuple[str | dict[str, Any], ...] = ("random",)
    bc_meta_episodes: int = 512
    bc_short_steps: int = 0  # first phase: prompts cut to their last bc_context_tokens tokens
    bc_short_batch_rows: int = 64
    bc_context_tokens: int = 64
    bc_steps: int = 270  # second phase: whole prompts
    bc_batch_rows: int = 32
    bc_batches_by_prompt: bool = False  # whole-prompt batches cut in prompt order (shared prefixes)
    bc_reflection_share: float | None = None  # of every batch's calls: reflections, over-sampled; None: as they come
    bc_learning_rate: float = 1e-3
    # preset.json's description of the warm start: evaluation-style rollouts per opponent
    check_meta_episodes: int = 64  # per split
    check_episodes: int = 3
    check_seed: int = 1234
    check_sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(0.7, 0.8, 20, 128))

    def __post_init__(self) -> None:
        object.__setattr__(self, "bc_rules", tuple(self.bc_rules))
        if self.vocab_size < 512:
            raise ValueError("model.tiny.vocab_size must be >= 512")
        if self.bc_reflection_share is not None and not 0.0 < self.bc_reflection_share < 1.0:
            raise ValueError(f"model.tiny.bc_reflection_share must be null or in (0, 1), got {self.bc_reflection_share!r}")


@dataclass(frozen=True)
class ModelConfig:
    """A model preset (``params/model``): where the weights come from and how they train."""

    name: str
    path: str  # a hub id or a local directory (the tiny preset: where it is built)
    build: str | None = None  # "tiny": built locally by mage.models.tiny; None: loaded as is
    local_dir: str | None = None  # a hub model is fetched here (DVC versions it); None: the hub cache
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


RUNNERS = ("thread", "process", "sequential")


@dataclass(frozen=True)
class FlowConfig:
    """``params/flow``: how the Prefect flows run (the library itself never reads this)."""

    runner: str = "thread"  # thread | process | sequential: the task runner of rollout shards
    max_workers: int = 2
    rollout_shards: int = 1  # rollout tasks per iteration (whole groups each)
    retries: int = 2  # retries of a task after a transient failure (OSError, timeouts, CUDA errors)
    retry_delay_seconds: float = 2.0  # first retry delay; doubles with every retry
    nightly_cron: str = "0 2 * * *"  # the nightly evaluation's schedule
    timezone: str | None = None  # of the cron schedule; None: this machine's local zone
    nightly_run: str | None = None  # the run the nightly evaluation takes (None: run.name)

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(f"flow.runner must be one of {list(RUNNERS)}, got {self.runner!r}")
        if self.max_workers < 1 or self.rollout_shards < 1 or self.retries < 0:
            raise ValueError("flow.max_workers >= 1, flow.rollout_shards >= 1 and flow.retries >= 0 required")
        if len(self.nightly_cron.split()) != 5:
            raise ValueError(f"flow.nightly_cron must be a five-field cron expression, got {self.nightly_cron!r}")


@dataclass(frozen=True)
class Settings:
    game: dict[str, Any]
    engine: EngineConfig
    model: ModelConfig
    algo: AlgoConfig
    train: TrainConfig
    eval: Any  # mage.evaluation.EvalConfig
    flow: FlowConfig
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
        _check_game_and_population(raw)
        from mage.evaluation import EvalConfig

        train = build(TrainConfig, raw.get("train"), "train")
        if backend == "vllm" and train.checkpoint_every != 1:
            # The engine loads each new policy from its checkpoint; with fewer checkpoints it would
            # sample from an older policy than the one PPO treats as on-policy.
            raise SettingsError(f"train.checkpoint_every: must be 1 with engine.backend=vllm (the engine serves each "
                                f"iteration's policy from its checkpoint), got {train.checkpoint_every}")
        eval_raw = dict(raw.get("eval") or {})
        eval_sampling = build(SamplingSettings, eval_raw.pop("sampling", {}), "eval.sampling")
        return cls(
            game=raw["game"],
            engine=EngineConfig(rollout, int(groups), backend, options[backend], sampling),
            model=model,
            algo=build(AlgoConfig, algo_raw, "algo"),
            train=train,
            eval=build(EvalConfig, eval_raw, "eval", sampling=eval_sampling),
            flow=build(FlowConfig, raw.get("flow"), "flow"),
            seed=int(raw.get("seed", 0)),
            paths=raw.get("paths") or {},
            run_name=str((raw.get("run") or {}).get("name", "default")),
            raw=raw,
        )

    def section_hash(self, *sections: str) -> str:
        """Stable hash of some sections of the raw config (what a cached result depends on)."""
        chosen = {name: self.raw.get(name) for name in sections} if sections else self.raw
        return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_game_and_population(raw: Mapping[str, Any]) -> None:
    """The game exists and takes these parameters; the population's entries are sound."""
    import inspect

    from mage.games import GAMES, make_game
    from mage.population import population_entries

    game = raw.get("game") or {}
    name = game.get("name")
    if name not in GAMES:
        raise SettingsError(f"game.name: unknown game {name!r}; allowed values: {sorted(GAMES)}")
    params = dict(game.get("params") or {})
    built = make_game(name)
    accepted = [p for p in inspect.signature(type(built).__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SettingsError(f"game.params: unknown key(s) {unknown} for {name}; allowed keys: {accepted}")
    try:
        make_game(name, **params)
        population_entries(raw)
    except (TypeError, ValueError) as error:
        raise SettingsError(str(error)) from None


def load_settings(overrides: Sequence[str] = (), config_file: str | Path | None = None) -> Settings:
    """Compose ``params/`` with Hydra ``overrides``, or read a composed YAML file (DVC's
    ``params.yaml``, composed by DVC from the same tree), and validate everything.

    Any problem (an unknown config group option, a key that does not exist, a wrong type or
    value) raises :class:`SettingsError` with a message naming the key and what is allowed.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mage.config import compose

    if config_file is not None and overrides:
        raise SettingsError("overrides apply to the params/ tree; a composed config file is used as it is")
    try:
        if config_file is None:
            cfg = compose(list(overrides))
        else:
            cfg = OmegaConf.load(config_file)
            OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise SettingsError(f"config: {error}{_allowed_keys_hint(str(error), overrides)}") from None
    return Settings.from_config(cfg)


def _allowed_keys_hint(message: str, overrides: Sequence[str]) -> str:
    """For Hydra's "Could not override 'a.b'": the keys that section ``a`` does have."""
    import re

    from mage.config import compose

    match = re.search(r"Could not override '([^']+)'", message)
    if not match or "." not in match.group(1):
        return ""
    section, _, _ = match.group(1).rpartition(".")
    try:
        cfg = compose([o for o in overrides if not o.startswith(match.group(1) + "=")])
        keys = sorted(OmegaConf.select(cfg, section).keys())
    except Exception:  # the hint is a courtesy; the original error stands on its own
        return ""
    return f"\nallowed keys in {section}: {keys}"
