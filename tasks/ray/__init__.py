"""``flow.runner=ray``: everything of the flows that knows Ray, one floor above the tasks.

The tasks below (``tasks.training`` and the rest) run on any Prefect task runner and import
nothing of Ray; the flows pick this package's variants when ``flow.runner`` is ``ray``:

* ``tasks.ray.setup``: what every Ray worker process runs first (the worker setup hook). Ray
  imports it in every worker it starts, so it imports nothing of the library.
* ``tasks.ray.cluster``: Prefect's Ray task runner, the checks a cluster must pass before any
  work, and the run's rollout worker actors (held while a training flow runs).
* ``tasks.ray.rollouts``: the rollout worker actor, how a shard task reaches it, the trainer's
  weights pushed to the actors through memory, the Ray resources of shard tasks.
* ``tasks.ray.update``: the update on ``train.workers`` Ray Train workers.
* ``tasks.ray.steps``: :class:`~tasks.ray.steps.RayFlowSteps`, the train flow's steps with
  rollouts on the actors, weights pushed after each save, the update on Ray Train's workers.

Nothing here imports Ray at import time: ``ray`` is imported inside the functions that use it
(``prefect_ray``, which the cluster module imports, puts a lazy one in ``sys.modules``).
"""
