"""A training run: the settings each step reads (:mod:`mage.run.reads`), its steps
(:mod:`mage.run.steps`), the one loop that runs them (:mod:`mage.run.loop`), its files
(:mod:`mage.run.layout`) and what each iteration records (:mod:`mage.run.record`). Works from
a notebook::

    from mage.run import train
    from mage.settings import load_settings

    result = train(load_settings(["game=kuhn_poker", "train.iterations=5"]))
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public names -> the module that defines them, imported on first use (``mage.run.reads`` is
#: read by tasks that never train, and needs no torch).
_EXPORTS = {"RunLayout": "mage.run.layout", "RunResult": "mage.run.loop", "Steps": "mage.run.loop",
            "train": "mage.run.loop"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mage.run' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
