"""``docs/configuration.md``, generated: every key of ``params/``, and every option of its
config groups.

:func:`render` writes the Markdown. The default settings come first, one table per section.
Each key has its type and its allowed values, read from the typed settings (pydantic
``Field`` bounds and ``Literal`` choices in :mod:`mage.config.sections`, the registered objectives,
estimators, games and opponents). Its default is the composed default config's value. Its
effect is the field's comment in :mod:`mage.config.sections`, or else the key's comment in the
``params/`` file it comes from. Then every option file of every config group follows, with
the keys it sets and their comments. The same files give the same bytes.
:func:`differences` names the keys that a committed copy lacks or has stale.

``params/`` is untrusted input here: the generator reads it with ``yaml.safe_load``, reads
its comments as text and composes it with Hydra as every command does. Nothing in it is
run.

    python -m mage config --docs docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml

from mage.algo import ESTIMATORS, OBJECTIVES
from mage.config import sections
from mage.config.comments import class_doc, field_comments, header_comment, is_global, yaml_comments
from mage.config.compose import compose_with_sources, config_dir
from mage.games import GAMES, make_game
from mage.opponents import REGISTRY
from mage.settings import Settings
from mage.settings.entries import ENTRY_KEYS

DOCS = "docs/configuration.md"
COMMAND = f"python -m mage config --docs {DOCS}"
_MISSING = object()
NONE = "—"
SECTION = "its keys below"

#: Allowed values that a rule in code checks (not a type): what the table says for them.
RULES: dict[str, str] = {
    "algo.objective": ", ".join(f"`{name}`" for name in sorted(OBJECTIVES)) + " (`mage.algo.register_objective`)",
    "algo.estimator": ", ".join(f"`{name}`" for name in sorted(ESTIMATORS)) + " (`mage.algo.register_estimator`)",
    "game.name": ", ".join(f"`{name}`" for name in sorted(GAMES)),
    "model.device": f"matches `{sections.DEVICE.pattern}`",
    "run.name": f"matches `{sections.PLAIN_NAME.pattern}`, without `..`",
    "flow.ray.address": f"null, or matches `{sections.RAY_ADDRESS.pattern}`",
    "flow.nightly_cron": "a five-field cron expression",
    "seed": ">= 0",
}
#: Keys of the composed config that no typed setting holds.
UNTYPED: dict[str, str] = {
    "algo.name": "the algorithm option's name: part of `run.name`; the settings do not read it",
}


@dataclass(frozen=True)
class Row:
    """One key: its dotted name, type, default, allowed values and effect (Markdown cells)."""

    key: str
    type: str
    default: str
    allowed: str
    effect: str

    def line(self) -> str:
        cells = (f"`{self.key}`", self.type, self.default, self.allowed or NONE, self.effect or NONE)
        return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def value_text(value: Any) -> str:
    """A config value as the YAML files write it, in a code span."""
    if value is _MISSING:
        return NONE
    if value is None or isinstance(value, bool):
        text = json.dumps(value)
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value) if value != "" else '""'
    return f"`{text}`"


def _lookup(values: Any, name: str) -> Any:
    return values[name] if isinstance(values, Mapping) and name in values else _MISSING


# -- types ---------------------------------------------------------------------------------
def _number(value: Any) -> str:
    return str(value) if not isinstance(value, float) else f"{value:g}"


def _bounds(metadata: tuple[Any, ...]) -> str:
    found: dict[str, Any] = {}
    for item in metadata:
        for constraint in getattr(item, "metadata", [item]):
            for name in ("ge", "gt", "le", "lt", "min_length"):
                if getattr(constraint, name, None) is not None:
                    found[name] = getattr(constraint, name)
    low = ("[", found["ge"]) if "ge" in found else ("(", found["gt"]) if "gt" in found else None
    high = (found["le"], "]") if "le" in found else (found["lt"], ")") if "lt" in found else None
    text = ""
    if low and high:
        text = f"in {low[0]}{_number(low[1])}, {_number(high[0])}{high[1]}"
    elif low:
        text = f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    elif high:
        text = f"{'<=' if high[1] == ']' else '<'} {_number(high[0])}"
    if found.get("min_length"):
        text = ", ".join(t for t in (text, "not empty") if t)
    return text


def describe(annotation: Any) -> tuple[str, str]:
    """(type, allowed values) of a field's annotation, in words."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        base, allowed = describe(args[0])
        return base, "; ".join(t for t in (allowed, _bounds(args[1:])) if t)
    if origin is Literal:
        return type(args[0]).__name__, ", ".join(value_text(a) for a in args)
    if origin in (Union, types.UnionType):
        kinds = [describe(a) for a in args if a is not type(None)]
        nullable = " or null" if type(None) in args else ""
        return " or ".join(k[0] for k in kinds) + nullable, "; ".join(k[1] for k in kinds if k[1])
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item, allowed = describe(args[0])
            return f"list of {item}", f"each {allowed}" if allowed else ""
        items = [describe(a) for a in args]
        same = len({k[1] for k in items}) == 1 and items[0][1]
        return "[" + ", ".join(k[0] for k in items) + "]", f"each {items[0][1]}" if same else ""
    if origin in (dict, Mapping, typing.Mapping) or annotation in (dict, Mapping):
        return "mapping", ""
    if dataclasses.is_dataclass(annotation):
        return "section", ""
    if annotation is Any:
        return "any", ""
    return getattr(annotation, "__name__", str(annotation)), ""


def _section_type(annotation: Any) -> type | None:
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def _entry_type(annotation: Any) -> type | None:
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        return value if dataclasses.is_dataclass(value) else None
    return None


# -- the default settings ------------------------------------------------------------------
@dataclass
class _Context:
    config: dict[str, Any]
    comments: dict[str, str]


def section_rows(kind: type, prefix: str, values: Any, context: _Context) -> Iterator[Row]:
    """The rows of a section's keys (nested sections and entries included)."""
    hints = typing.get_type_hints(kind, include_extras=True)
    comments = field_comments(kind)
    for field in dataclasses.fields(kind):
        key, annotation = f"{prefix}.{field.name}", hints[field.name]
        value = _lookup(values, field.name)
        type_text, allowed = describe(annotation)
        effect = comments.get(field.name) or context.comments.get(key, "")
        nested, entry = _section_type(annotation), _entry_type(annotation)
        if entry is not None:
            ids = ", ".join(f"`{name}`" for name in value) if isinstance(value, Mapping) else NONE
            yield Row(key, "mapping of id to entry", ids, "", effect or class_doc(entry))
            yield from _entry_rows(entry, key)
        elif nested is not None:
            yield Row(key, type_text, "`null`" if value is None else SECTION, "", effect or class_doc(nested))
            yield from section_rows(nested, key, value, context)
        else:
            yield Row(key, type_text, value_text(value), RULES.get(key, allowed), effect)
            if key == "game.params" and isinstance(value, Mapping):
                yield from _game_param_rows(context.config["game"]["name"], value, context.comments)


def _entry_rows(entry: type, prefix: str) -> Iterator[Row]:
    hints, comments = typing.get_type_hints(entry, include_extras=True), field_comments(entry)
    for name in ENTRY_KEYS:
        type_text, allowed = describe(hints[name])
        if name == "opponent":
            allowed = "; ".join(f"{game}: " + ", ".join(f"`{o}`" for o in sorted(REGISTRY[game]))
                                for game in sorted(REGISTRY)) + " (`mage.opponents.REGISTRY`)"
        yield Row(f"{prefix}.<id>.{name}", type_text, NONE, allowed, comments.get(name, ""))


def _game_param_rows(game: str, values: Mapping[str, Any], comments: Mapping[str, str]) -> Iterator[Row]:
    signature = inspect.signature(type(make_game(game)).__init__)
    for name, value in values.items():
        parameter = signature.parameters.get(name)
        annotation = parameter.annotation if parameter is not None else ""
        type_text = annotation if isinstance(annotation, str) else describe(annotation)[0]
        yield Row(f"game.params.{name}", type_text, value_text(value), "checked when the game is built",
                  comments.get(f"game.params.{name}", ""))


def default_rows(config: Mapping[str, Any], comments: Mapping[str, str]) -> dict[str, list[Row]]:
    """Every key of the composed default ``config``, per top-level section."""
    context = _Context(dict(config), dict(comments))
    hints = typing.get_type_hints(Settings, include_extras=True)
    tables: dict[str, list[Row]] = {}
    for field in dataclasses.fields(Settings):
        if field.name == "raw":
            continue
        annotation, value = hints[field.name], _lookup(config, field.name)
        kind = _section_type(annotation)
        if kind is None:
            tables[field.name] = [Row(field.name, describe(annotation)[0], value_text(value),
                                      RULES.get(field.name, ""), field_comments(Settings).get(field.name, ""))]
            continue
        rows = list(section_rows(kind, field.name, value, context))
        for key, effect in UNTYPED.items():
            if key.startswith(field.name + "."):
                rows.insert(0, Row(key, "str", value_text(_lookup(value, key.split(".", 1)[1])), "", effect))
        tables[field.name] = rows
    return tables


# -- the options of the config groups ------------------------------------------------------
def _flatten(data: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    entry = re.fullmatch(r"population\.(train|held_out)\.[^.]+", prefix)
    if isinstance(data, Mapping) and data and not entry:
        for key, value in data.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, data


def how_selected(group: str, option: str) -> str:
    if group == "experiment":
        return f"`+experiment={option}`"
    if group == "model_setup":
        return f"applied with `model={option}`"
    if group == "model_game":
        model, _, game = option.partition("/")
        return f"applied with `model={model} game={game}`"
    return f"`{group}={option}`"


def option_lines(directory: Path, group: str, path: Path, default: bool) -> list[str]:
    text = path.read_text()
    option = path.relative_to(directory / group).with_suffix("").as_posix()
    data = yaml.safe_load(text) or {}
    prefix = "" if is_global(text) else group
    extends = data.pop("defaults", None) if isinstance(data, dict) else None
    comments = yaml_comments(text, prefix)
    where = f"file `{path.relative_to(directory.parent).as_posix()}`."
    lines = [f"### {group}={option}", "", f"{how_selected(group, option)}{' (the default)' if default else ''}; {where}"]
    if extends:
        lines[-1] += f" Its Hydra defaults list: `{json.dumps(extends)}`."
    if header_comment(text):
        lines += ["", *header_comment(text)]
    lines += ["", "| key | value | comment |", "|---|---|---|"]
    for key, value in _flatten(data, prefix):
        lines.append("| " + " | ".join(_cell(c) for c in (f"`{key}`", value_text(value), comments.get(key) or NONE))
                     + " |")
    return [*lines, ""]


# -- the page ------------------------------------------------------------------------------
def render() -> str:
    """``docs/configuration.md`` for the config tree (``params/``, or ``$MAGE_CONFIG_DIR``)."""
    from omegaconf import OmegaConf

    directory = config_dir()
    composed, sources = compose_with_sources([])
    config = OmegaConf.to_container(composed, resolve=True)
    files = {group: [path for p in source.split(" or ") if (path := Path(p).resolve()).is_file()]
             for group, source in sources.items()}
    files = {group: paths for group, paths in files.items() if paths}
    comments: dict[str, str] = {}
    for group, paths in sorted(files.items()):
        for path in paths:
            text = path.read_text()
            prefix = "" if is_global(text) or path.parent == directory else group
            for key, comment in yaml_comments(text, prefix).items():
                comments.setdefault(key, comment)
    chosen = {group: paths[0].relative_to(directory / group).with_suffix("").as_posix()
              for group, paths in files.items() if paths[0].parent != directory}
    lines = [
        "# Configuration",
        "",
        f"Generated by `{COMMAND}` from `params/` and the typed settings",
        "(`mage/config/sections.py`); do not edit it by hand: `tests/test_configuration_docs.py` fails, naming",
        "the key, when it is out of date.",
        "",
        "Every key is a Hydra override (`python -m mage config train.iterations=5`, `python -m flows",
        "pipeline game=tic_tac_toe`, `dvc exp run -S algo=grpo`). A config group option (`game=sokoban`)",
        "swaps a whole file; the options are listed after the defaults. Types and ranges are checked",
        "before any work starts (`mage/settings/validate.py`); the method behind the keys is in",
        "[method.md](method.md).",
        "",
        "## The default settings",
        "",
        "Composed from `params/config.yaml` with the options",
        ", ".join(f"`{g}={o}`" for g, o in sorted(chosen.items())) + ".",
        f"A default of {NONE} is a key the defaults leave out: a key of a section set to null, or of a",
        "population entry (`<id>` stands for an entry's id).",
        "",
    ]
    hints = typing.get_type_hints(Settings, include_extras=True)
    for section, rows in default_rows(config, comments).items():
        kind = _section_type(hints[section])
        lines += [f"### {section}", ""]
        if kind is not None and class_doc(kind):
            lines += [class_doc(kind), ""]
        lines += ["| key | type | default | allowed | effect |", "|---|---|---|---|---|", *(r.line() for r in rows), ""]
    lines += ["## Config groups and their options", ""]
    for group in sorted(p.name for p in directory.iterdir() if p.is_dir()):
        for path in sorted((directory / group).rglob("*.yaml")):
            option = path.relative_to(directory / group).with_suffix("").as_posix()
            lines += option_lines(directory, group, path, chosen.get(group) == option)
    return "\n".join(lines).rstrip("\n") + "\n"


def _rows_by_key(text: str) -> dict[str, str]:
    rows, heading = {}, ""
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("| `"):
            key = line.split("|")[1].strip().strip("`")
            rows[f"{key} (under \"{heading}\")"] = line
    return rows


def differences(committed: str, generated: str) -> list[str]:
    """What a committed page lacks or has stale, against the generated one, key by key."""
    old, new = _rows_by_key(committed), _rows_by_key(generated)
    found = [f"{key}: missing" for key in new if key not in old]
    found += [f"{key}: stale (committed {old[key]!r}, generated {new[key]!r})" for key in new
              if key in old and old[key] != new[key]]
    found += [f"{key}: not a key any more" for key in old if key not in new]
    if not found and committed != generated:
        found.append("the text outside the key tables differs")
    return found
