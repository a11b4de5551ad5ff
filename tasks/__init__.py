"""The lifecycle's tasks: thin Prefect wrappers over the steps of ``mage.run.steps``.

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
                                                              metrics history, checkpoint, start
                                                              tables, the tables' policy record,
                                                              the compared checkpoint, out dir
=====================  =====================================  ====================================

The training iteration's steps (``tasks.training``: ``rollout-shard``, ``score-rollout``,
``train-iteration``, ``save-checkpoint``, and on Ray ``push-weights``) are not cached: the run resumes from its
checkpoints (``mage.run.loop``).

Modules: the tasks of ``tasks.population``, ``tasks.model``, ``tasks.training`` and
``tasks.evaluation`` (a flow imports only the tasks it runs, so a DVC stage depends only on
their code); what they share: ``tasks.caching`` (cache keys, retries), ``tasks.refs`` (file
references), ``tasks.state`` (a process's rollout worker), ``tasks.ray_workers`` (the Ray
side) and ``tasks.artifacts`` (what the UI shows).
"""
