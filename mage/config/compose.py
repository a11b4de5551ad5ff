"""Composing the Hydra config tree in ``params/`` from Python.

``compose(["game=tic_tac_toe", "seed=3"])`` returns the same configuration that the
command line, a Prefect flow's ``overrides`` parameter or DVC compose from those overrides.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

REPO_ROOT = Path(__file__).resolve().parents[2]


def config_dir() -> Path:
    """``$MAGE_CONFIG_DIR`` if set, else the repository's ``params/``."""
    return Path(os.environ.get("MAGE_CONFIG_DIR", REPO_ROOT / "params")).resolve()


#: Top-level keys of the composed config that are not config groups: config.yaml sets them.
ROOT_KEYS = ("seed", "run", "paths")


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config tree with Hydra overrides; interpolations are resolved."""
    return compose_with_sources(overrides, config_name)[0]


def compose_with_sources(overrides: Sequence[str] = (), config_name: str = "config",
                         resolve: bool = True) -> tuple[DictConfig, dict[str, str]]:
    """:func:`compose`, and for each top-level section the file(s) it came from (the group
    option Hydra chose), so that an error can name the file to fix. ``resolve`` False leaves the
    interpolations as they are (``${eval.episodes}``), to be resolved after sections of another
    composition replace some of these (:func:`mage.settings.validate.held_out_settings`)."""
    directory = config_dir()
    if not (directory / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(f"no {config_name}.yaml in config directory {directory}")
    with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg, _sources(directory, config_name, choices)


def _sources(directory: Path, config_name: str, choices: dict) -> dict[str, str]:
    def shown(path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    root = shown(directory / f"{config_name}.yaml")
    sources = {key: root for key in ROOT_KEYS}
    for group, choice in choices.items():
        if "/" in group or group.startswith("hydra") or choice is None:
            continue
        sources[group] = shown(directory / group / f"{choice}.yaml")
    for refining in ("model_setup", "model_game"):  # they refine model, train, eval and engine
        refinement = directory / refining / f"{choices.get(refining)}.yaml"
        if choices.get(refining) and refinement.is_file():
            extra = shown(refinement)
            for group in ("model", "train", "eval", "engine"):
                if group in sources:
                    sources[group] += f" or {extra}"
    return sources


def dump(overrides: Sequence[str] = ()) -> str:
    """The composed config as YAML: what DVC's Hydra composition writes to ``params.yaml``."""
    return OmegaConf.to_yaml(compose(overrides))
