"""The lifecycle's tasks: thin Prefect wrappers over ``mage`` (see ``tasks.caching``).

Every task takes the composed config as a plain dict (``Settings.raw``) plus file
references, writes its large result under ``paths`` atomically and returns a
:class:`~tasks.refs.FileRef` (with a few numbers beside it where the flow logs them).

=====================  =====================================  ==============================
task                   result                                 cache key (besides code)
=====================  =====================================  ==============================
seed_population        the population manifest                game, population
prepare_model          the base model directory               model, game, population
rollout_shard          one shard's trajectory table           game, population, engine, model,
                                                              seed, run; checkpoint; iteration
score_rollout          the iteration's scored table           algo, engine.sampling; shards
train_iteration        the new checkpoint and its metrics     model, algo, train, seed, run;
                                                              table; parent checkpoint
evaluate_checkpoint    evaluation table and metrics           eval, engine, game, population,
                                                              model; checkpoint; split
write_report           the report (JSON, Markdown, plots)     run, eval, game, model; tables,
                                                              manifest, metrics history,
                                                              checkpoint, start tables, the
                                                              tables' policy record, the
                                                              compared checkpoint, out dir
=====================  =====================================  ==============================

Modules: ``tasks.population``, ``tasks.model``, ``tasks.training`` and ``tasks.evaluation``
(a flow imports only the tasks it runs, so a DVC stage depends only on their code).
"""
