"""The opponents a run plays: the population manifest seeded from ``params/population/``
(:mod:`mage.population.manifest`), the exact ceilings written into it
(:mod:`mage.population.ceilings`) and the league of the policy's own snapshots
(:mod:`mage.population.league`)."""
