"""Typed, validated settings from the composed Hydra tree: ``params/`` is the one source of truth.

``load_settings(overrides)`` composes ``params/`` (or reads an already composed file such
as DVC's ``params.yaml``) and ``Settings.from_config(cfg)`` builds every section into its
dataclass of :mod:`mage.config.sections`. Nothing has a built-in default: a missing section or key
is an error that names it and the file it belongs in, so a truncated or hand-edited config
never runs on values the code made up. Types, ranges and fixed choices are checked by
pydantic; rules between sections are checked last (:func:`check_across`), each saying how
to fix the problem. Every problem raises :class:`SettingsError` naming the key, what was
given and what is allowed, before any work starts.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mage.algo import ESTIMATORS, OBJECTIVES
from mage.config.sections import (
    GAME_OPTION,
    SPLITS,
    AlgoSection,
    EngineSection,
    EvalSection,
    FlowSection,
    GameSection,
    ModelSection,
    PathsSection,
    PopulationSection,
    RunSection,
    TrainSection,
)

__all__ = ["Settings", "SettingsError", "build", "held_out_games", "held_out_settings", "load_settings", "select"]

#: How to regenerate a composed config file that is damaged or out of date.
REGENERATE = "regenerate it with `python -m mage config --output params.yaml`"


class SettingsError(ValueError):
    """A configuration key or value is not allowed (the message names the key)."""


def plain(value: Any) -> Any:
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _section_type(annotation: Any) -> type | None:
    """The section dataclass a field holds (``X`` or ``X | None``), else None."""
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def build(kind: type, section: Any, where: str, source: str | None = None, **extra: Any) -> Any:
    """Instantiate section ``kind`` from ``section``: every field must be given (by the section
    or by ``extra``), no other key is allowed, nested sections are built the same way, and
    every value is validated. ``source`` is the file the section comes from, named in errors."""
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
    missing = [name for name in allowed if name not in values]
    if missing:
        raise SettingsError(f"{where}.{missing[0]}: missing{in_file}; every key must be set"
                            + (f" (also missing: {missing[1:]})" if missing[1:] else ""))
    for name in allowed:
        nested = _section_type(_hints(kind)[name])
        if nested is not None and name not in extra and values[name] is not None:
            values[name] = build(nested, values[name], f"{where}.{name}", source)
    try:
        return TypeAdapter(kind).validate_python(values)  # nested sections come built: kept as they are
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "value_error":  # from __post_init__: the message names the field
            message = str(first["ctx"]["error"])
            named = re.fullmatch(r"[A-Za-z_][\w.]*:?", message.split(" ")[0]) is not None
            raise SettingsError((f"{where}.{message}" if named else f"{where}: {message}") + in_file) from None
        key = ".".join(str(part) for part in (where, *first["loc"]))
        given = repr(first.get("input"))
        raise SettingsError(f"{key}: {first['msg'].replace('Input should', 'must')} (got {given[:200]})"
                            f"{in_file}") from None


def select(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key of a plain config (None where it is missing)."""
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


@dataclass(frozen=True)
class Settings:
    """A whole, validated configuration: one typed section per top-level key of ``params/``,
    and ``raw``, the composed config they were built from (what hashes and DVC read)."""

    game: GameSection
    population: PopulationSection
    engine: EngineSection
    model: ModelSection
    algo: AlgoSection
    train: TrainSection
    eval: EvalSection
    flow: FlowSection
    seed: int  # the run's seed: its initial states, sampling and update order derive from it
    paths: PathsSection
    run: RunSection
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def run_name(self) -> str:
        return self.run.name

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping[str, Any], sources: Mapping[str, str] | str | None = None) -> Settings:
        """Validate a composed config. ``sources``: the file each section came from (a mapping
        from :func:`mage.config.compose.compose_with_sources`, or one file for all of them)."""
        raw = plain(cfg)
        if not isinstance(raw, Mapping) or not raw:
            raise SettingsError(f"config: empty{f' ({sources})' if isinstance(sources, str) else ''}; "
                                f"a config holds the sections {list(SECTIONS)}")
        raw = dict(raw)

        def source(section: str) -> str | None:
            return sources if isinstance(sources, str) or sources is None else sources.get(section)

        unknown = sorted(set(raw) - set(SECTIONS) - {"model_setup", "model_game", "experiment"})
        if unknown:
            raise SettingsError(f"config: unknown section(s) {unknown}; allowed sections: {list(SECTIONS)}")
        for name in SECTIONS:
            if raw.get(name) is None:
                hint = f"; {REGENERATE}" if isinstance(sources, str) else ""
                raise SettingsError(f"{name}: missing section (in {source(name) or 'the config'}){hint}")
        seed = raw["seed"]  # first: train.seed and others interpolate it
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SettingsError(f"seed: must be an integer >= 0 (got {seed!r}) (in {source('seed')})")
        built: dict[str, Any] = {"seed": seed}
        # In order, but the population last: its entries are checked against the game, and its
        # ceilings copy eval.episodes, so `eval.episodes=0` is named where it was set.
        for name in sorted(SECTIONS, key=lambda section: section == "population"):
            section = raw[name]
            if name == "population":
                built[name] = _population(raw, source(name))
            elif name != "seed":
                if name == "algo" and isinstance(section, Mapping):  # `name` names the option file
                    section = {k: v for k, v in section.items() if k != "name"}
                built[name] = build(_hints(cls)[name], section, name, source(name))
        settings = cls(**built, raw=raw)
        check_across(settings)
        return settings

    def values_of(self, keys: Iterable[str], ignore: Iterable[str] = ()) -> dict[str, Any]:
        """The values of dotted ``keys`` in the composed config, without the sub-keys in ``ignore``."""
        chosen = {key: copy.deepcopy(select(self.raw, key)) for key in sorted(set(keys))}
        for dotted in ignore:
            chosen.pop(dotted, None)
            for key, value in chosen.items():
                if dotted.startswith(key + "."):
                    *parents, last = dotted[len(key) + 1:].split(".")
                    for part in parents:
                        value = value.get(part) if isinstance(value, dict) else None
                    if isinstance(value, dict):
                        value.pop(last, None)
        return chosen

    def hash_of(self, keys: Iterable[str], ignore: Iterable[str] = ()) -> str:
        """A short, stable hash of :meth:`values_of` (what a cached result depends on)."""
        text = json.dumps(self.values_of(keys, ignore), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: The sections a composed config must hold (the fields of :class:`Settings`), in the order they are checked.
SECTIONS = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "raw")


def check_across(settings: Settings) -> None:
    """Rules between sections, each naming the key and how to fix it."""
    engine, train, algo, flow = settings.engine, settings.train, settings.algo, settings.flow
    if algo.objective not in OBJECTIVES:
        raise SettingsError(f"algo.objective: must be one of {sorted(OBJECTIVES)} (mage.algo.register_objective "
                            f"adds one), got {algo.objective!r}")
    if algo.estimator not in ESTIMATORS:
        raise SettingsError(f"algo.estimator: must be one of {sorted(ESTIMATORS)} (mage.algo.register_estimator "
                            f"adds one), got {algo.estimator!r}")
    if algo.estimator == "grpo" and engine.episodes > 1:
        raise SettingsError(f"algo.estimator: grpo is single-episode RL, and engine.episodes is {engine.episodes}: "
                            "set engine.episodes=1 (the same episode budget: scale engine.groups by the episodes, "
                            "as algo=grpo does)")
    if engine.sampling.temperature == 0:
        raise SettingsError("engine.sampling.temperature: must be > 0: the training rollouts' replies are "
                            "scored under the distribution they were sampled from, and greedy decoding has none "
                            "(eval.sampling may be greedy)")
    check_staleness(settings)
    if train.checkpoint_every != 1 and (engine.backend == "vllm" or flow.remote_rollouts):
        # Rollouts outside the trainer's process sample from the policy's checkpoint: with fewer
        # checkpoints they would sample from an older policy than the one PPO treats as on-policy.
        where = "engine.backend=vllm (the engine serves each iteration's policy from its checkpoint)" \
            if engine.backend == "vllm" else f"flow.runner={flow.runner} (rollouts in other processes load " \
                                             "each iteration's policy from its checkpoint)"
        raise SettingsError(f"train.checkpoint_every: must be 1 with {where}, got {train.checkpoint_every}; "
                            "set train.checkpoint_every=1 (and train.keep_checkpoints to bound the disk)")
    if flow.rollout_shards > engine.groups:
        raise SettingsError(f"flow.rollout_shards: {flow.rollout_shards} shards for {engine.groups} groups leave "
                            f"{flow.rollout_shards - engine.groups} with nothing to play (a shard plays whole "
                            "groups); set flow.rollout_shards <= engine.groups")
    check_workers(settings)
    check_league(settings)
    for game in settings.eval.games:  # each composed and validated whole, before any work
        held_out_settings(settings, game)


def check_staleness(settings: Settings) -> None:
    """``train.max_staleness`` > 0: what the overlapped loop needs (mage.run.loop)."""
    train, engine, flow = settings.train, settings.engine, settings.flow
    if not train.max_staleness:
        return
    stale = f"train.max_staleness={train.max_staleness}"
    if engine.sampling.temperature != 1.0:
        raise SettingsError(f"engine.sampling.temperature: must be 1.0 with {stale}, got "
                            f"{engine.sampling.temperature}: the rollouts record their tokens' log-probs at "
                            "temperature 1, and the update weighs a stale call by them; set "
                            "engine.sampling.temperature=1.0, or train.max_staleness=0")
    if settings.population.league.enabled:
        raise SettingsError(f"population.league.enabled: the league is not yet played with {stale} (a rollout "
                            "would be dealt from a league its iteration has not reached); set "
                            "population.league.enabled=false, or train.max_staleness=0")
    unbuilt = {"engine.backend": (engine.backend, "hf"), "flow.runner": (flow.runner, "thread"),
               "train.workers": (train.workers, 1)}
    found = {key: value for key, (value, built) in unbuilt.items() if value != built}
    if found:
        have = ", ".join(f"{key}={value}" for key, value in found.items())
        fit = " ".join(f"{key}={unbuilt[key][1]}" for key in found)
        raise SettingsError(f"train.max_staleness: {train.max_staleness} overlaps the rollout and the update in one "
                            f"process, with the hf backend; {have} {'are' if len(found) > 1 else 'is'} not built for it yet: set {fit}, or "
                            "train.max_staleness=0")


#: The config groups a game held out at evaluation takes from its own files (``eval.games``).
HELD_OUT_GROUPS = ("game", "population")


def held_out_games() -> list[str]:
    """The games ``eval.games`` may list: those with a game file and a population file in ``params/``."""
    from mage.config.compose import config_dir

    directory = config_dir()
    return sorted(path.stem for path in (directory / "game").glob("*.yaml")
                  if all((directory / group / path.name).is_file() for group in HELD_OUT_GROUPS))


def held_out_settings(settings: Settings, game: str) -> Settings:
    """The settings that play ``settings``' policies on ``game``, a game held out at evaluation
    (``eval.games``). The game and its population are ``game``'s own, as
    ``load_settings([f"game={game}"])`` composes them (``params/game/<game>.yaml``,
    ``params/population/<game>.yaml``, the population's interpolations resolved against the
    run's settings), and so is its population manifest (``paths.population_manifest``, under
    the run's ``paths.artifacts``). Everything else is the run's: the model (its checkpoints and
    its starting policy), the engine, the evaluation (size, seed, sampling), the run's name and
    the other paths. Its own ``eval.games`` is empty.

    Raises :class:`SettingsError` naming ``eval.games`` and ``game``: a game with no game or
    population file, the game the run trains on, or a game whose files do not validate."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mage.config.compose import compose_with_sources, config_dir

    where = f"eval.games: {game!r}"
    if not isinstance(game, str) or not GAME_OPTION.fullmatch(game):
        raise SettingsError(f"{where}: not a game's name (a file of params/game/, without .yaml)")
    missing = [f"params/{group}/{game}.yaml" for group in HELD_OUT_GROUPS
               if not (config_dir() / group / f"{game}.yaml").is_file()]
    if missing:
        raise SettingsError(f"{where}: unknown game, there is no {' and no '.join(missing)}; games that can be "
                            f"held out: {[name for name in held_out_games() if name != settings.game.name]}")
    if game == settings.game.name:
        raise SettingsError(f"{where}: the run trains on {game}, so it is not held out; list other games")
    try:
        composed, sources = compose_with_sources([f"game={game}"], resolve=False)
        own = OmegaConf.to_container(composed, resolve=False)
        raw = copy.deepcopy(settings.raw)
        for group in HELD_OUT_GROUPS:
            raw[group] = own[group]
        raw["paths"] = {**raw["paths"], "population_manifest": own["paths"]["population_manifest"]}
        raw["eval"] = {**raw["eval"], "games": []}
        merged = OmegaConf.create(raw)
        OmegaConf.resolve(merged)
    except (HydraException, OmegaConfBaseException, KeyError, TypeError) as error:
        raise SettingsError(f"{where}: {_one_line(error)}") from None
    try:
        held = Settings.from_config(merged, {group: sources[group] for group in HELD_OUT_GROUPS if group in sources})
    except SettingsError as error:
        raise SettingsError(f"{where}: {error}") from None
    if (held.game.name, held.game.params) == (settings.game.name, settings.game.params):
        raise SettingsError(f"{where}: params/game/{game}.yaml is the game the run trains on "
                            f"({settings.game.name}), so it is not held out; list other games")
    return held


def check_league(settings: Settings) -> None:
    """A league needs a two-player game and a model to snapshot, served in the process's backend
    (hf: a model per snapshot; vLLM: a LoRA adapter per snapshot on the agent's engine)."""
    league = settings.population.league
    if not league.enabled:
        return
    if settings.game.num_players != 2:
        raise SettingsError(f"population.league.enabled: a league of snapshots plays the other seat, and "
                            f"{settings.game.name} has one player; set population.league.enabled=false")
    backend = settings.engine.backend
    if backend == "scripted":
        raise SettingsError("population.league.enabled: a scripted agent has no weights to snapshot; set "
                            "engine.backend=hf or vllm")
    if backend == "vllm" and settings.model.lora is None:
        # a full-weights snapshot would swap the engine's weights out from under the agent's at
        # every call (a restart of the engine on a CPU); an adapter is one more LoRA request
        raise SettingsError("population.league.enabled: with engine.backend=vllm the snapshots are LoRA adapters "
                            "served beside the agent's, and model.lora is not set (full fine-tuning); set model.lora "
                            "or engine.backend=hf")


def check_workers(settings: Settings) -> None:
    """The update's workers and where they run (``train.workers``, ``flow.placement``); whether
    they fit the cluster is checked when it is connected (:func:`mage.preflight.placement.check_placement`)."""
    model, train, flow = settings.model, settings.train, settings.flow
    if train.workers > 1 and flow.runner != "ray":
        raise SettingsError(f"train.workers: {train.workers} update workers run on Ray Train, and flow.runner is "
                            f"{flow.runner}: set flow.runner=ray (docs/gpu.md, \"A Ray cluster\") or "
                            "train.workers=1 (the update in the flow's process)")
    if train.workers > train.mini_batch_size:
        raise SettingsError(f"train.workers: {train.workers} workers share each mini-batch of "
                            f"train.mini_batch_size={train.mini_batch_size} rows, which leaves "
                            f"{train.workers - train.mini_batch_size} with nothing to do; set train.workers <= "
                            "train.mini_batch_size")
    if flow.placement == "colocated":
        if train.workers == 1:
            raise SettingsError("flow.placement: colocated puts the update workers beside the engines on the Ray "
                                "cluster, and train.workers=1 runs the update in the flow's process: set "
                                "train.workers > 1 or flow.placement=split")
        if train.worker_gpus and flow.ray.shard_gpus:
            raise SettingsError("flow.placement: colocated on GPUs is not supported yet: the engines live in Ray "
                                "actors that hold their GPUs for the whole run, and nothing puts them to sleep "
                                "during the update, so the update's workers would wait for GPUs for ever; set "
                                "flow.placement=split (docs/gpu.md, \"One node of several GPUs\")")
    if train.workers > 1 and train.worker_gpus and model.device == "cpu":
        raise SettingsError("train.worker_gpus: 1 gives each update worker a GPU (NCCL), and model.device is cpu: "
                            "set train.worker_gpus=0 for CPU workers (gloo)")


def _population(raw: Mapping[str, Any], source: str | None) -> PopulationSection:
    """The population's own keys, then its entries, each checked against the game."""
    from mage.settings.entries import population_entries

    try:
        entries = tuple(population_entries(raw))
    except (TypeError, ValueError) as error:
        raise SettingsError(f"{error} (in {source})" if source else str(error)) from None
    split = {name: {e.id: e for e in entries if e.split == name} for name in SPLITS}
    return build(PopulationSection, raw["population"], "population", source, **split)


def load_settings(overrides: Sequence[str] = (), config_file: str | Path | None = None) -> Settings:
    """Compose ``params/`` with Hydra ``overrides``, or read a composed YAML file (DVC's
    ``params.yaml``, composed by DVC from the same tree), and validate everything.

    Any problem (an unknown config group option, a key that does not exist, a wrong type or
    value) raises :class:`SettingsError` with a message naming the key and what is allowed.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mage.config.compose import compose_with_sources

    if config_file is not None and overrides:
        raise SettingsError("overrides apply to the params/ tree; a composed config file is used as it is")
    if config_file is not None:
        return Settings.from_config(read_config_file(config_file), str(config_file))
    for override in overrides:
        check_override_syntax(override)
    try:
        cfg, sources = compose_with_sources(list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise SettingsError(f"{_one_line(error)}{_allowed_keys_hint(str(error), overrides)}") from None
    return Settings.from_config(cfg, sources)


#: An override's key: ``+``/``++``/``~`` and a dotted name (group options may hold ``@``).
_OVERRIDE_KEY = re.compile(r"(\+\+|\+|~)?([A-Za-z_][A-Za-z0-9_.@/-]*)")


def check_override_syntax(override: str) -> None:
    """One override as Hydra's parser reads it, or a :class:`SettingsError` in this project's
    form, naming the key and what to do (Hydra's lexer says "no viable alternative" first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, equals, value = override.partition("=")
    if not equals and not override.startswith("~"):
        raise SettingsError(f"{override!r}: an override is key=value (for example train.iterations=20)")
    match = _OVERRIDE_KEY.fullmatch(key)
    if match is None:
        raise SettingsError(f"{key!r}: not a config key (letters, digits, '_' and '.'; for example run.name=...)")
    name = match.group(2)
    try:
        OverridesParser.create().parse_override(override)
    except Exception as error:  # Hydra's parser raises several kinds; each becomes one line
        if not value.isascii():
            why = "characters outside ASCII must be quoted"
        elif value.count('"') % 2 or value.count("'") % 2:
            why = "a quote is not closed"
        elif any(value.count(a) != value.count(b) for a, b in ("[]", "{}", "()")):
            why = "a bracket is not closed"
        else:
            why = _one_line(error).split("; See https://")[0]
        raise SettingsError(f"{name}: cannot read the value {value!r}: {why}; quote a text value, in the shell "
                            f"too: '{name}=\"...\"'") from None


def read_config_file(path: str | Path) -> DictConfig:
    """A composed config file, resolved; a missing, empty or malformed file is a
    :class:`SettingsError` naming it."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise SettingsError(f"{path}: no such config file")
    text = path.read_text(errors="replace")
    if not text.strip():
        raise SettingsError(f"{path}: the config file is empty; {REGENERATE}")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SettingsError(f"{path}: not valid YAML{where} ({getattr(error, 'problem', None) or error}); "
                            f"{REGENERATE}") from None
    if not isinstance(loaded, dict):
        raise SettingsError(f"{path}: a config file must be a mapping of sections, got {type(loaded).__name__}; "
                            f"{REGENERATE}")
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
    from mage.config.compose import compose

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
