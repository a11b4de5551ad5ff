"""The configuration as written: the Hydra tree of ``params/`` composed (:mod:`mage.config.compose`),
the typed sections it fills (:mod:`mage.config.sections`) and the comments that document each key
(:mod:`mage.config.comments`). Checked as a whole, it becomes :class:`mage.settings.Settings`.

This floor sits below everything that reads a section of its own (the algorithms, the
backends, the opponents); the validated settings sit above them, since their checks ask the
games, the opponents and the algorithms.
"""
