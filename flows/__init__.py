"""Prefect flows composing the tasks of ``tasks/`` into the lifecycle (docs/pipeline.md, "The flows").

Each flow lives in a module named for its part of the lifecycle (``flows.training`` holds
``train``) and is imported only when it is used (``from flows import train``), so running one
flow loads only its own code: a DVC stage then depends on exactly the code its flow imports (a
test checks ``dvc.yaml`` against it). The modules' names differ from the flows' on purpose:
importing a submodule binds its name on this package, and a module named ``train`` would put
itself where ``flows.train``, the flow, is looked up.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Flow name -> the module that defines it.
FLOWS = {
    "seed_population": "flows.population",
    "prepare_model": "flows.model",
    "train": "flows.training",
    "evaluate": "flows.evaluation",
    "report": "flows.evaluation",
    "pipeline": "flows.lifecycle",
    "nightly_evaluation": "flows.evaluation",
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


__all__ = ["FLOWS", "load", *FLOWS]
