"""Prefect flows composing the tasks of ``tasks/`` into the lifecycle (docs/pipeline.md, "The flows").

Each flow lives in its own module and is imported only when it is used
(``from flows import train``), so running one flow loads only its own code: a DVC stage
then depends on exactly the code its flow imports (a test checks ``dvc.yaml`` against it).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: Flow name -> the module that defines it.
FLOWS = {
    "seed_population": "flows.seed_population",
    "prepare_model": "flows.prepare_model",
    "train": "flows.train",
    "evaluate": "flows.evaluate",
    "report": "flows.evaluate",
    "pipeline": "flows.pipeline",
    "nightly_evaluation": "flows.evaluate",
}


def load(name: str) -> Any:
    """The flow called ``name``."""
    if name not in FLOWS:
        raise ValueError(f"unknown flow {name!r}; flows: {sorted(FLOWS)}")
    return getattr(importlib.import_module(FLOWS[name]), name)


def __getattr__(name: str) -> Any:
    if name in FLOWS:
        return load(name)
    raise AttributeError(f"module 'flows' has no attribute {name!r}")


class _Flows(types.ModuleType):
    """Keeps ``flows.<name>`` the flow: importing the submodule ``flows.train`` would otherwise
    bind the module over the name, and ``from flows import train`` would then give a module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FLOWS and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["flows.<name>"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Flows


__all__ = ["FLOWS", "load", *FLOWS]
