"""Returns, advantages and losses of MAGE (MAGE-SPEC sections 3-5)."""

from mage.algo.advantages import add_advantages
from mage.algo.config import AlgoConfig
from mage.algo.returns import add_returns

__all__ = ["AlgoConfig", "add_advantages", "add_returns"]
