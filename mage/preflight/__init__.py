"""What is checked before any work, after the settings are valid: the paths a run writes
(:mod:`mage.preflight.paths`), the accelerator memory plan (:mod:`mage.preflight.memory_plan`)
and the placement of workers on a cluster (:mod:`mage.preflight.placement`, arithmetic only:
Ray itself lives in ``tasks/ray/``)."""
