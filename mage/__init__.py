"""MAGE: meta-reinforcement learning for strategic exploration and exploitation.

The library, one package per concern (the floors: DEVELOPERS.md, "Floors"): games, the reply
protocol, the configuration and the validated settings, algorithms, opponents, backends,
models, the population, the checks before work, rollouts, the trainer, evaluation, the report,
the tiny preset's warm start, and the run, which trains, evaluates and reports as the flows do.
It imports no Prefect and no Ray, so every function is usable from a notebook.
"""

__version__ = "0.1.0"
