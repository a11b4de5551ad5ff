"""Typed, validated settings from the composed Hydra tree: ``params/`` is the one source of truth.

``load_settings(overrides)`` composes ``params/`` (or reads an already composed file such
as DVC's ``params.yaml``) and ``Settings.from_config(cfg)`` turns every section into its
dataclass (``GameConfig``, ``PopulationConfig``, ``EngineConfig``, ``ModelConfig``,
``AlgoConfig``, ``TrainConfig``, ``EvalConfig``, ``FlowConfig``, ``PathsConfig``,
``RunConfig``). Nothing has a built-in default here: a missing section or key is an error
that names it and the file it belongs in, so a truncated or hand-edited config never runs
on values the code made up. Types, ranges and fixed choices are checked by pydantic; every
problem raises :class:`SettingsError` naming the key, what was given and what is allowed,
before any work starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mage.algo.config import AlgoConfig
from mage.backends.base import SamplingSettings
from mage.rollout.engine import RolloutConfig
from mage.sections import (
    CeilingSettings,
    EngineConfig,
    EvalConfig,
    FlowConfig,
    GameConfig,
    HFOptions,
    ModelConfig,
    PathsConfig,
    PopulationConfig,
    RunConfig,
    ScriptedOptions,
    TinyBuild,
    VLLMOptions,
)
from mage.train.config import LoraSettings, TrainConfig

__all__ = ["FlowConfig", "ModelConfig", "Settings", "SettingsError", "TinyBuild", "build", "load_settings"]

#: The sections a composed config must hold, in the order they are checked.
SECTIONS = ("game", "population", "engine", "model", "algo", "train", "eval", "flow", "seed", "run", "paths")


class SettingsError(ValueError):
    """A configuration key or value is not allowed (the message names the key)."""


def plain(value: Any) -> Any:
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def build(kind: type, section: Any, where: str, source: str | None = None, **extra: Any) -> Any:
    """Instantiate dataclass ``kind`` from ``section``: every field must be given (by the
    section or by ``extra``), no other key is allowed, and every value is validated.
    ``source`` is the file the section comes from, named in the error."""
    from pydantic import TypeAdapter, ValidationError

    in_file = f" (in {source})" if source else ""
    section = plain(section)
    if section is None:
        raise SettingsError(f"{where}: missing section{in_file}")
    if not isinstance(section, Mapping):
        raise SettingsError(f"{where}: must be a mapping of keys to values, got {section!r}{in_file}")
    values = dict(section) | extra
    allowed = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise SettingsError(f"{where}: unknown key(s) {unknown}{in_file}; allowed keys: {allowed}")
    optional = {f.name for f in dataclasses.fields(kind) if f.name == "entries"}  # filled in, never configured
    missing = [name for name in allowed if name not in values and name not in optional]
    if missing:
        raise SettingsError(f"{where}.{missing[0]}: missing{in_file}; every key must be set"
                            + (f" (also missing: {missing[1:]})" if missing[1:] else ""))
    try:
        return TypeAdapter(kind).validate_python(values)  # nested sections come built: kept as they are
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "value_error":  # from __post_init__: the message names the field
            message = str(first["ctx"]["error"])
            named = re.fullmatch(r"[A-Za-z_][\w.]*:?", message.split(" ")[0]) is not None
            return _raise(f"{where}.{message}" if named else f"{where}: {message}", in_file)
        key = ".".join(str(part) for part in (where, *first["loc"]))
        given = repr(first.get("input"))
        _raise(f"{key}: {first['msg'].replace('Input should', 'must')} (got {given[:200]})", in_file)


def _raise(message: str, in_file: str) -> None:
    raise SettingsError(message + in_file)


@dataclass(frozen=True)
class Settings:
    game: GameConfig
    population: PopulationConfig
    engine: EngineConfig
    model: ModelConfig
    algo: AlgoConfig
    train: TrainConfig
    eval: EvalConfig
    flow: FlowConfig
    seed: int
    paths: PathsConfig
    run: RunConfig
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def run_name(self) -> str:
        return self.run.name

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping[str, Any], sources: Mapping[str, str] | str | None = None) -> Settings:
        """Validate a composed config. ``sources``: the file each section came from (a mapping
        from :func:`mage.config.compose_with_sources`, or one file for all of them)."""
        raw = plain(cfg)
        if not isinstance(raw, Mapping) or not raw:
            raise SettingsError(f"config: empty{f' ({sources})' if isinstance(sources, str) else ''}; "
                                f"a config holds the sections {list(SECTIONS)}")

        def source(section: str) -> str | None:
            return sources if isinstance(sources, str) or sources is None else sources.get(section)

        unknown = sorted(set(raw) - set(SECTIONS) - {"model_game", "experiment"})
        if unknown:
            raise SettingsError(f"config: unknown section(s) {unknown}; allowed sections: {list(SECTIONS)}")
        for name in SECTIONS:
            if raw.get(name) is None:
                hint = "; regenerate it with `python -m mage.config --output params.yaml`" if isinstance(sources, str) else ""
                raise SettingsError(f"{name}: missing section (in {source(name) or 'the config'}){hint}")
        seed = raw["seed"]  # first: train.seed and others interpolate it
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SettingsError(f"seed: must be an integer >= 0 (got {seed!r}) (in {source('seed')})")
        game = build(GameConfig, raw["game"], "game", source("game"))
        population = _population(raw, source("population"))
        engine = _engine(raw["engine"], source("engine"))
        model_raw = dict(raw["model"]) if isinstance(raw["model"], Mapping) else raw["model"]
        nested = {}
        if isinstance(model_raw, Mapping):
            lora, tiny = model_raw.pop("lora", None), model_raw.pop("tiny", None)
            nested = {"lora": build(LoraSettings, lora, "model.lora", source("model")) if lora is not None else None,
                      "tiny": _tiny(tiny, source("model")) if tiny is not None else None}
        model = build(ModelConfig, model_raw, "model", source("model"), **nested)
        algo_raw = dict(raw["algo"]) if isinstance(raw["algo"], Mapping) else raw["algo"]
        if isinstance(algo_raw, Mapping):
            algo_raw.pop("name", None)  # names the option file; the fields say what it does
            algo_raw.setdefault("max_response_tokens", engine.sampling.max_new_tokens)
        algo = build(AlgoConfig, algo_raw, "algo", source("algo"))
        train = build(TrainConfig, raw["train"], "train", source("train"))
        if engine.backend == "vllm" and train.checkpoint_every != 1:
            # The engine loads each new policy from its checkpoint; with fewer checkpoints it would
            # sample from an older policy than the one PPO treats as on-policy.
            raise SettingsError(f"train.checkpoint_every: must be 1 with engine.backend=vllm (the engine serves each "
                                f"iteration's policy from its checkpoint), got {train.checkpoint_every}")
        if engine.sampling.temperature == 0:
            raise SettingsError("engine.sampling.temperature: must be > 0: the training rollouts' replies are "
                                "scored under the distribution they were sampled from, and greedy decoding has none "
                                "(eval.sampling may be greedy)")
        eval_raw = dict(raw["eval"]) if isinstance(raw["eval"], Mapping) else raw["eval"]
        eval_sampling = {}
        if isinstance(eval_raw, Mapping):
            eval_sampling = {"sampling": build(SamplingSettings, eval_raw.pop("sampling", None), "eval.sampling",
                                               source("eval"))}
        return cls(
            game=game,
            population=population,
            engine=engine,
            model=model,
            algo=algo,
            train=train,
            eval=build(EvalConfig, eval_raw, "eval", source("eval"), **eval_sampling),
            flow=build(FlowConfig, raw["flow"], "flow", source("flow")),
            seed=seed,
            paths=build(PathsConfig, raw["paths"], "paths", source("paths")),
            run=build(RunConfig, raw["run"], "run", source("run")),
            raw=raw,
        )

    def section_hash(self, *sections: str) -> str:
        """Stable hash of some sections of the raw config (what a cached result depends on)."""
        chosen = {name: self.raw.get(name) for name in sections} if sections else self.raw
        return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _engine(section: Any, source: str | None) -> EngineConfig:
    """``params/engine``: the rollout keys, the batch, the backend and its options, sampling."""
    engine = plain(section)
    if not isinstance(engine, Mapping):
        return build(EngineConfig, engine, "engine", source)
    engine = dict(engine)
    nested = {
        "hf": build(HFOptions, engine.pop("hf", None), "engine.hf", source),
        "vllm": build(VLLMOptions, engine.pop("vllm", None), "engine.vllm", source),
        "scripted": build(ScriptedOptions, engine.pop("scripted", None), "engine.scripted", source),
        "sampling": build(SamplingSettings, engine.pop("sampling", None), "engine.sampling", source),
    }
    own = {key: engine.pop(key) for key in ("groups", "backend") if key in engine}
    nested["rollout"] = build(RolloutConfig, engine, "engine", source)
    return build(EngineConfig, own, "engine", source, **nested)


def _tiny(section: Any, source: str | None) -> TinyBuild:
    tiny = plain(section)
    nested = {}
    if isinstance(tiny, Mapping) and "check_sampling" in tiny:
        tiny = dict(tiny)
        nested["check_sampling"] = build(SamplingSettings, tiny.pop("check_sampling"), "model.tiny.check_sampling",
                                         source)
    return build(TinyBuild, tiny, "model.tiny", source, **nested)


def _population(raw: Mapping[str, Any], source: str | None) -> PopulationConfig:
    """The population's own keys, then its entries, checked against the game."""
    from mage.population import population_entries

    section = plain(raw["population"])
    nested = {}
    if isinstance(section, Mapping):
        section = dict(section)
        nested["ceilings"] = build(CeilingSettings, section.pop("ceilings", None), "population.ceilings", source)
    population = build(PopulationConfig, section, "population", source, **nested)
    try:
        entries = tuple(population_entries(raw))
    except (TypeError, ValueError) as error:
        raise SettingsError(f"{error} (in {source})" if source else str(error)) from None
    return dataclasses.replace(population, entries=entries)


def load_settings(overrides: Sequence[str] = (), config_file: str | Path | None = None) -> Settings:
    """Compose ``params/`` with Hydra ``overrides``, or read a composed YAML file (DVC's
    ``params.yaml``, composed by DVC from the same tree), and validate everything.

    Any problem (an unknown config group option, a key that does not exist, a wrong type or
    value) raises :class:`SettingsError` with a message naming the key and what is allowed.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mage.config import compose_with_sources

    if config_file is not None and overrides:
        raise SettingsError("overrides apply to the params/ tree; a composed config file is used as it is")
    if config_file is not None:
        return Settings.from_config(read_config_file(config_file), str(config_file))
    try:
        cfg, sources = compose_with_sources(list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise SettingsError(f"{_one_line(error)}{_allowed_keys_hint(str(error), overrides)}") from None
    return Settings.from_config(cfg, sources)


def read_config_file(path: str | Path) -> DictConfig:
    """A composed config file, resolved; a missing, empty or malformed file is a
    :class:`SettingsError` naming it."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    regenerate = "regenerate it with `python -m mage.config --output params.yaml`"
    if not path.is_file():
        raise SettingsError(f"{path}: no such config file")
    text = path.read_text(errors="replace")
    if not text.strip():
        raise SettingsError(f"{path}: the config file is empty; {regenerate}")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SettingsError(f"{path}: not valid YAML{where} ({getattr(error, 'problem', None) or error}); "
                            f"{regenerate}") from None
    if not isinstance(loaded, dict):
        raise SettingsError(f"{path}: a config file must be a mapping of sections, got {type(loaded).__name__}; "
                            f"{regenerate}")
    try:
        cfg = OmegaConf.create(loaded)
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as error:
        raise SettingsError(f"{path}: {_one_line(error)}") from None
    return cfg


def _one_line(error: BaseException) -> str:
    """Hydra's and OmegaConf's messages run over several lines: one line of what is wrong
    and what is allowed, without OmegaConf's full_key/object_type trailer."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type=",
                                                            "Config search path", "provider="))]
    text = ""
    for line in lines:
        text += line if not text else (" " if text.endswith(":") else "; ") + line
    return text[:600]


def _allowed_keys_hint(message: str, overrides: Sequence[str]) -> str:
    """For Hydra's "Could not override 'a.b'": the keys that section ``a`` does have."""
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
    return f"; allowed keys in {section}: {keys}"
