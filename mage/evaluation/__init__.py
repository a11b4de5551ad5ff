"""Evaluating a policy: meta-episodes against a split of the population, per episode and per
opponent, with the record of the policy that played (:mod:`mage.evaluation.play`), and Kuhn
Poker's exact exploitability (:mod:`mage.evaluation.exploitability`)."""
