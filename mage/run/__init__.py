"""A training run: its steps (:mod:`mage.run.steps`), the one loop that runs them
(:mod:`mage.run.loop`), its files (:mod:`mage.run.layout`) and what each iteration records
(:mod:`mage.run.record`). Works from a notebook::

    from mage.run import train
    from mage.settings import load_settings

    result = train(load_settings(["game=kuhn_poker", "train.iterations=5"]))
"""

from mage.run.layout import RunLayout
from mage.run.loop import RunResult, Steps, train

__all__ = ["RunLayout", "RunResult", "Steps", "train"]
