"""Flows ``evaluate`` (one checkpoint, per episode and per opponent), ``report`` and
``nightly_evaluation`` (the newest checkpoint against the held-out population, one report per
night). Each calls the library's :func:`mage.run.evaluate` or :func:`mage.run.report` with its
steps as Prefect tasks (:class:`tasks.evaluation.FlowEvaluationSteps`): a notebook that calls
the same function gets the same tables and the same report."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import TaskRunner

import mage.run
from flows.common import local_timezone, logger, settings_for, task_runners
from mage.run.layout import RunLayout
from mage.settings import Settings
from tasks.evaluation import FlowEvaluationSteps


def steps_for(settings: Settings) -> FlowEvaluationSteps:
    """The evaluation's steps as tasks; on Ray, the splits play side by side on the cluster."""
    if settings.flow.runner != "ray":
        return FlowEvaluationSteps(settings)

    @contextlib.contextmanager
    def side_by_side() -> Iterator[TaskRunner]:
        from tasks.ray.rollouts import shard_options

        with task_runners(settings, 0) as split_runner, shard_options(settings.flow):
            yield split_runner

    return FlowEvaluationSteps(settings, side_by_side)


@flow(name="evaluate")
def evaluate(overrides: list[str] | None = None, config_file: str | None = None, checkpoint: str | None = None,
             split: str | None = None, out_dir: str | None = None, report: bool = True,
             start: bool = False) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (default: the run's final one; none yet: the starting policy),
    or with ``start`` the starting policy itself, against the opponents of ``split`` (default
    ``eval.split``; ``all``: training and held-out), per episode and per opponent, on the run's
    game and on each game of ``eval.games``, and with ``report`` report it beside the starting
    policy (:func:`mage.run.evaluate`)."""
    settings = settings_for(overrides, config_file)
    return mage.run.evaluate(settings, checkpoint, split, out_dir, report, start, steps=steps_for(settings))


@flow(name="report")
def report(overrides: list[str] | None = None, config_file: str | None = None, evaluation_dir: str | None = None,
           out_dir: str | None = None, start_dir: str | None = None) -> dict[str, Any]:
    """The report of the evaluation tables in ``evaluation_dir`` (default: those of the run's
    final checkpoint) beside the starting policy's in ``start_dir``, written to ``out_dir``
    (default ``paths.report``); only the run's final checkpoint against its starting policy
    updates ``paths.metrics`` (:func:`mage.run.report`)."""
    settings = settings_for(overrides, config_file)
    return mage.run.report(settings, evaluation_dir, out_dir, start_dir, steps=steps_for(settings))


@flow(name="nightly_evaluation")
def nightly_evaluation(overrides: list[str] | None = None, config_file: str | None = None,
                       run: str | None = None) -> dict[str, Any]:
    """The final checkpoint of run ``run`` (default ``flow.nightly_run``, else the configured
    ``run.name``) against the held-out population, and of each game of ``eval.games`` (games it
    did not train on); the report is kept per night under ``paths.nightly/<date>/<run>``."""
    from prefect.runtime import flow_run

    settings = settings_for(overrides, config_file)
    run = run or settings.flow.nightly_run or settings.run_name
    runs = RunLayout.of(settings).root.parent
    if not run or "/" in run or "\\" in run or run in (".", ".."):
        raise ValueError(f"run must be the plain name of a run under {runs}, got {run!r}")
    checkpoint = RunLayout.of(settings, run).final_checkpoint()
    if checkpoint is None:
        logger().warning(f"run {run} has no checkpoint under {runs / run}: evaluating the base model")
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(settings.flow.timezone or local_timezone())
    scheduled = flow_run.scheduled_start_time  # the night it was scheduled for, in the schedule's zone
    night = (scheduled or datetime.now(zone)).astimezone(zone).strftime("%Y-%m-%d")
    out_dir = Path(settings.paths.nightly) / night / run
    logger().info(f"nightly evaluation {night} of run {run}: {checkpoint or 'the base model'} -> {out_dir}")
    return mage.run.evaluate(settings, checkpoint, "held_out", out_dir, start=checkpoint is None,
                             title=f"nightly-{night}-{run}", steps=steps_for(settings))
