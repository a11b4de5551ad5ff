"""A run: the settings each step reads (:mod:`mage.run.reads`), its steps
(:mod:`mage.run.steps`), the one loop that trains (:mod:`mage.run.loop`), the evaluation and
report of its checkpoints (:mod:`mage.run.evaluation`), its files (:mod:`mage.run.layout`) and
what each iteration records (:mod:`mage.run.record`). The flows call these same functions.
Works from a notebook::

    from mage.run import evaluate, report, train
    from mage.settings import load_settings

    settings = load_settings(["game=kuhn_poker", "train.iterations=5"])
    result = train(settings)                                    # flow train
    played = evaluate(settings, split="all", report=False)     # flow evaluate: the final checkpoint
    start = evaluate(settings, start=True, split="all", report=False)  # and the starting policy
    written = report(settings, played["directory"], start_dir=start["directory"])  # flow report
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public names -> the module that defines them, imported on first use (``mage.run.reads`` is
#: read by tasks that never train, and needs no torch).
_EXPORTS = {"RunLayout": "mage.run.layout", "RunResult": "mage.run.loop", "Steps": "mage.run.loop",
            "train": "mage.run.loop", "EvaluationSteps": "mage.run.evaluation", "evaluate": "mage.run.evaluation",
            "report": "mage.run.evaluation"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mage.run' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
