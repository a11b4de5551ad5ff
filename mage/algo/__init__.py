"""Returns, advantages and losses of MAGE (docs/method.md: Rewards and returns, Advantages, The
policy update): objectives and estimators registered by name (:data:`OBJECTIVES`,
:data:`ESTIMATORS`)."""

from mage.algo.advantages import ESTIMATORS, add_advantages, register_estimator
from mage.algo.returns import OBJECTIVES, Penalties, add_returns, register_objective

__all__ = ["ESTIMATORS", "OBJECTIVES", "Penalties", "add_advantages", "add_returns", "register_estimator",
           "register_objective"]
