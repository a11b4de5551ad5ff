"""Flow ``train``: iterations of rollout -> advantages -> update -> checkpoint.

Each iteration fans its rollout shards out through the configured task runner, scores the
shards into one table, updates the policy from the previous checkpoint and checkpoints the
result; every ``train.eval_every`` iterations the checkpoint plays the held-out opponents.
Every task is cached on what determines its result, so re-running a finished or crashed
run skips the finished iterations and continues where it stopped; lengthening a run
(``train.iterations=...``) reuses the iterations it already has.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from prefect import flow

from flows.common import (configured, describe_iteration, logger, make_runner, publish_training_table, settings_for,
                          shard_options, shard_workers)
from mage import io
from mage.rollout.engine import RolloutStats
from mage.settings import Settings
from mage.train.loop import RunPaths, record_iteration, rollout_metrics_of
from tasks.evaluation import evaluate_checkpoint
from tasks.model import prepare_model
from tasks.refs import FileRef
from tasks.training import rollout_shard, score_rollout, train_iteration


@flow(name="train")
def train(overrides: list[str] | None = None, config_file: str | None = None) -> dict[str, Any]:
    """Train ``run.name`` for ``train.iterations`` iterations; returns the last checkpoint and metrics."""
    settings = settings_for(overrides, config_file)
    config, flow_cfg = settings.raw, settings.flow
    log = logger()
    model = configured(prepare_model, flow_cfg)(config)
    rollout, score, update = (configured(t, flow_cfg) for t in (rollout_shard, score_rollout, train_iteration))
    evaluate = configured(evaluate_checkpoint, flow_cfg)
    checkpoint: FileRef | None = None
    history: list[dict[str, Any]] = []
    evaluations: dict[int, Any] = {}
    shards = flow_cfg.rollout_shards
    log.info(f"run {settings.run_name}: {settings.train.iterations} iterations, {settings.engine.groups} groups x "
             f"{settings.engine.rollout.group_size} meta-episodes, {shards} rollout shard(s) on a {flow_cfg.runner} runner")
    with (RunPaths.of(settings).writing(), make_runner(flow_cfg) as runner,
          shard_workers(settings, runner, shards) as shard_runner, iteration_reports(settings, log) as report):
        for iteration in range(1, settings.train.iterations + 1):
            with shard_options(flow_cfg):
                futures = [
                    shard_runner.submit(rollout, {"config": config, "model": model, "checkpoint": checkpoint,
                                                  "iteration": iteration, "shard": shard, "shards": shards})
                    for shard in range(shards)
                ]
            played = [future.result() for future in futures]
            table = score(config, [p["table"] for p in played], iteration)
            result = update(config, model, table, checkpoint, iteration)
            checkpoint = result["checkpoint"]
            history.append(result["metrics"] | rollout_metrics_of([RolloutStats(**p["stats"]) for p in played]))
            report(history)
            every = settings.train.eval_every
            if every and iteration % every == 0:
                evaluations[iteration] = evaluate(config, model, checkpoint, settings.eval.split)
                finals = {row["opponent"]: row["final_win_rate"] for row in evaluations[iteration]["final"]}
                log.info(f"evaluation at iteration {iteration} ({settings.eval.split}): final-episode win rate "
                         + ", ".join(f"{k} {v:.2f}" for k, v in finals.items()))
    root = RunPaths.of(settings).root
    final = root / "final.json"
    # Relative to the run's directory: a run copied or moved elsewhere still names its own
    # checkpoint, not the original's (an absolute path did not, nor did one relative to the
    # working directory once the run was given another name).
    recorded = os.path.relpath(checkpoint.path, root) if checkpoint else None
    io.write_json(final, {"checkpoint": recorded,
                          "sha256": checkpoint.sha256 if checkpoint else None, "iterations": settings.train.iterations})
    log.info(f"final checkpoint: {checkpoint.path if checkpoint else 'none (0 iterations)'}")
    return {"checkpoint": checkpoint, "metrics": history[-1] if history else {}, "evaluations": evaluations}


@contextlib.contextmanager
def iteration_reports(
    settings: Settings, log: logging.Logger | logging.LoggerAdapter
) -> Iterator[Callable[[list[dict[str, Any]]], None]]:
    """Where a finished iteration's metrics go (the last of ``history``): ``metrics.jsonl`` and
    the drift warning as the library records them, a log line, the UI's training table and
    dvclive's metrics and plots (``paths.live``), which are closed however the flow ends."""
    live = None
    if settings.paths.live:
        from dvclive import Live

        # The DVC pipeline declares these metrics and plots itself: no dvc.yaml edits, no extra experiments.
        live = Live(dir=str(settings.paths.live), resume=False, save_dvc_exp=False, dvcyaml=None, report=None)

    def report(history: list[dict[str, Any]]) -> None:
        metrics = history[-1]
        warning = record_iteration(settings, metrics)
        log.info(describe_iteration(metrics))
        if warning:
            log.warning(warning)
        publish_training_table(settings.run_name, history)
        if live is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "iteration":
                    live.log_metric(key, value)
            live.next_step()

    try:
        yield report
    finally:
        if live is not None:
            live.end()
