"""The lifecycle's tasks: thin Prefect wrappers over the steps of ``mage.run``: the training
iteration's (``mage.run.steps``) and the evaluation's (``mage.run.evaluation``).

Every task takes the validated :class:`~mage.settings.Settings` plus file references, writes
its large result under ``paths`` atomically and returns a :class:`~tasks.refs.FileRef`
(with a few numbers beside it where the flow logs them). The cached ones key on the
settings their step declares it reads (``mage.run.reads.READS``, see ``tasks.caching``),
their code and the library's, and their inputs' content hashes:

=====================  =====================================  ====================================
task                   result                                 cache key (besides code)
=====================  =====================================  ====================================
seed-population        the population manifest                READS["seed_population"]
prepare-model          the base model directory               READS["prepare_model"]
evaluate-checkpoint    evaluation table and its record        READS["evaluate"]; checkpoint; split;
                                                              out dir
write-report           the report (JSON, Markdown, plots)     READS["report"]; tables, manifest,
                                                              metrics history, what the report is
                                                              about (policy, sampling, compared
                                                              checkpoint), start tables, out dir
=====================  =====================================  ====================================

The training iteration's steps (``tasks.training``: ``rollout-shard``, ``score-rollout``,
``update-policy``, ``save-checkpoint``; on Ray, ``tasks.ray.steps``, also ``push-weights`` and
``update-policy-on-workers``) are not cached: the run resumes from its checkpoints
(``mage.run.loop``).

Modules: the tasks of ``tasks.population``, ``tasks.model``, ``tasks.training`` and
``tasks.evaluation`` (a flow imports only the tasks it runs, so a DVC stage depends only on
their code); what they share: ``tasks.caching`` (cache keys, retries), ``tasks.refs`` (file
references), ``tasks.worker`` (a process's rollout worker) and ``tasks.artifacts`` (what the
UI shows). Above them all, ``tasks.ray``: everything that knows Ray (the cluster, its actors
and workers, the steps that use them); no other module here imports it, nor Ray.

Nothing is imported here: Ray imports this package in every worker process it starts, on the
way to its setup hook (``tasks.ray.setup``).
"""
