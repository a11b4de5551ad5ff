"""MAGE: meta-reinforcement learning for strategic exploration and exploitation.

The library: games, opponents, the text protocol, rollouts, training and evaluation.
It imports no Prefect, so every function is usable from a notebook.
"""

__version__ = "0.1.0"
