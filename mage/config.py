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
from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent


def config_dir() -> Path:
    """``$MAGE_CONFIG_DIR`` if set, else the repository's ``params/``."""
    return Path(os.environ.get("MAGE_CONFIG_DIR", REPO_ROOT / "params")).resolve()


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config tree with Hydra overrides; interpolations are resolved."""
    directory = config_dir()
    if not (directory / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(f"no {config_name}.yaml in config directory {directory}")
    with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


def dump(overrides: Sequence[str] = ()) -> str:
    """The composed config as YAML: what DVC's Hydra composition writes to ``params.yaml``."""
    return OmegaConf.to_yaml(compose(overrides))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m mage.config [--output FILE] [overrides ...]``: print or write the composed config.

    ``python -m mage.config --output params.yaml`` regenerates the committed ``params.yaml``
    (``dvc exp run`` composes it the same way, with its ``-S`` overrides)."""
    import argparse
    import sys

    from mage import io

    parser = argparse.ArgumentParser(prog="python -m mage.config", description=main.__doc__)
    parser.add_argument("--output", help="write here (atomically) instead of printing")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    text = dump(args.overrides)
    if args.output:
        io.write_text(args.output, text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
