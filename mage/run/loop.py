"""The training run, written once: resume, then per iteration rollout -> score -> update ->
record -> checkpoint (when due; written behind the next rollout where nothing reads it first,
:func:`writes_behind`) -> evaluate (when due), then ``final.json``.

With ``train.max_staleness`` 1 the rollout of iteration k+1 plays while update k runs, on a copy
of the weights from before update k (:meth:`Steps.rollout_behind`); the loop waits for it before
checkpoint k, and keeps its table in the run (:func:`mage.run.steps.keep_ahead`), so a run
resumed from checkpoint k trains on the same table, and continues as the uninterrupted run does.

:func:`train` is the only loop body. How each step runs is a :class:`Steps` object's
business: this module's runs them in this process (a notebook, ``benchmarks/``); the
``train`` flow passes ``tasks.training.FlowSteps`` (on Ray its ``tasks.ray.steps.RayFlowSteps``),
which runs the same step functions of :mod:`mage.run.steps` as Prefect tasks (and rollout
shards on its task runner). Checkpoints, evaluations, ``metrics.jsonl``, ``final.json``,
dvclive, drift warnings and resume are this loop's, so they behave the same whichever way the
steps run.

A run directory belongs to one configuration: ``run.json`` records the settings its
iterations depend on (:func:`mage.run.reads.run_identity`). A run resumes from its newest
complete checkpoint, with the same weights, optimizer and RNG state, when they are equal;
lengthening a run (``train.iterations``), checkpointing it more often, or giving it smaller
micro-batches or another device keeps them equal. Iterations after that checkpoint are computed
again (what a stopped call recorded of them is dropped), and an evaluation the call was
stopped in is made. Under other settings the old run and its evaluations are moved aside
(``<run>.replaced-<time>``, named in a warning) and the run starts again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from mage import io, stopping
from mage.backends import loads_checkpoints, takes_weights_in_memory
from mage.config.sections import splits_of
from mage.models import checkpoint as ckpt
from mage.rollout import RolloutStats
from mage.run import reads, record, steps
from mage.run.layout import RunLayout, evaluation_dir
from mage.run.state import TrainingState, start_training
from mage.settings import Settings

logger = logging.getLogger(__name__)


class Steps:
    """Each step of the iteration, run in this process. A subclass may run them elsewhere
    (``tasks.training.FlowSteps``: as Prefect tasks) but must compute the same results."""

    def __init__(self, settings: Settings, progress: bool = True) -> None:
        self.settings, self.progress = settings, progress

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter:
        """Where the loop's lines go (the flow's: Prefect's run logger)."""
        return logger

    def prepare(self) -> None:
        """The base model, built or fetched (:func:`mage.warmstart.prepare_model`)."""
        from mage.warmstart import prepare_model

        if self.settings.train.workers > 1:  # checked before any work
            raise ValueError(f"train.workers={self.settings.train.workers}: the update's workers are Ray Train's, "
                             "which the train flow starts (`python -m flows train`); in this process set "
                             "train.workers=1")

        prepare_model(self.settings, progress=self.progress)

    def start(self, checkpoint: ckpt.Checkpoint | None) -> TrainingState:
        return start_training(self.settings, checkpoint)

    def rollout(self, state: TrainingState, iteration: int) -> tuple[list[pl.DataFrame], list[RolloutStats]]:
        """Every shard of the iteration (``flow.rollout_shards``), in turn, from the policy in memory."""
        return self._play(state, state.backend(), iteration, iteration - 1)

    def rollout_behind(self, state: TrainingState, iteration: int) -> Ahead:
        """Start every shard of ``iteration``'s rollout, in turn on a thread, on a copy of the
        weights as they are now (:meth:`TrainingState.sync_behind`), and return at once: the
        caller updates the trainer's weights meanwhile."""
        state.sync_behind()
        backend, version = state.backend_behind(), state.iteration
        return in_thread(lambda: self._play(state, backend, iteration, version), f"rollout-{iteration}-behind")

    def _play(self, state: TrainingState, backend: Any, iteration: int,
              version: int) -> tuple[list[pl.DataFrame], list[RolloutStats]]:
        played = [steps.rollout(self.settings, backend, iteration, shard, self.progress, snapshots=state.snapshots,
                                policy_version=version) for shard in range(self.settings.flow.rollout_shards)]
        return [table for table, _ in played], [stats for _, stats in played]

    def score(self, tables: list[pl.DataFrame], iteration: int) -> pl.DataFrame:
        return steps.score(self.settings, tables, iteration)

    def update(self, state: TrainingState, table: pl.DataFrame, iteration: int) -> dict[str, float]:
        return steps.update(state, table, iteration)

    def save(self, state: TrainingState, metrics: dict[str, Any], behind: bool = False) -> ckpt.Checkpoint:
        return steps.save(state, metrics, behind)

    def evaluate(self, state: TrainingState) -> dict[str, list[dict[str, Any]]]:
        """The newest checkpoint against ``eval.split``'s opponents: each split's final-episode rows."""
        return {split: steps.evaluate(self.settings, state.checkpoint, split, progress=self.progress)["final"]
                for split in splits_of(self.settings.eval.split)}

    def report(self, record: dict[str, Any], warning: str | None, history: list[dict[str, Any]]) -> None:
        """A finished iteration (its metrics and performance): its log line and drift warning
        (the flow adds the UI's table of ``history``)."""
        self.log.info(describe_iteration(record))
        if warning:
            self.log.warning(warning)

    def reported_evaluation(self, iteration: int, split: str, final: list[dict[str, Any]]) -> None:
        self.log.info(f"evaluation at iteration {iteration} ({split}): final-episode win rate "
                      + ", ".join(f"{row['opponent']} {row['final_win_rate']:.2f}" for row in final))


@dataclass(frozen=True)
class Ahead:
    """A rollout playing behind the update (:meth:`Steps.rollout_behind`): ``result()`` waits
    until every shard has ended and gives their tables and stats, or raises what stopped one."""

    result: Callable[[], tuple[list[pl.DataFrame], list[RolloutStats]]]


def in_thread(play: Callable[[], Any], name: str) -> Ahead:
    """``play()`` on a thread of its own, started now; a daemon, so that a process that exits
    does not wait for a rollout that nothing will train on."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = play()
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits
            outcome["error"] = error

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return Ahead(result)


@dataclass
class RunResult:
    """What a call of :func:`train` did: the checkpoint it resumed from, the iterations it ran,
    the newest checkpoint, every recorded iteration's metrics and performance, and the
    evaluations it made."""

    settings: Settings
    resumed_from: ckpt.Checkpoint | None = None
    iterations: list[int] = field(default_factory=list)
    checkpoint: ckpt.Checkpoint | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    evaluations: dict[int, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    drift_warnings: dict[int, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return (self.checkpoint.iteration if self.checkpoint else 0) == self.settings.train.iterations


def checkpoint_due(settings: Settings, iteration: int) -> bool:
    """Every ``train.checkpoint_every`` iterations, at the last one, before an evaluation (an
    evaluation is of a checkpoint: its tables name it) and when a league snapshot joins."""
    train = settings.train
    league = settings.population.league  # a snapshot joining the league is its checkpoint
    return iteration % train.checkpoint_every == 0 or iteration == train.iterations or \
        evaluation_due(settings, iteration) or (league.enabled and iteration % league.snapshot_every == 0)


def writes_behind(settings: Settings, iteration: int) -> bool:
    """Whether checkpoint ``iteration`` may be written while the next rollout plays
    (``train.write_behind``): where nothing reads it before the next update, which waits for it
    (so do Ray Train's workers, ``train.workers`` > 1, which start from it). Not the last
    iteration's (``final.json`` names it), nor one evaluated or joining the league (they load
    it), nor where the rollouts read it: workers in other processes that are not pushed its
    weights (:func:`pushes_weights`), or a vLLM engine that loads it (a LoRA adapter, or
    ``weight_sync=disk``; with ``memory`` it takes the weights from the trainer and the
    checkpoint's name only)."""
    train, engine, league = settings.train, settings.engine, settings.population.league
    if not train.write_behind or (settings.flow.remote_rollouts and not pushes_weights(settings)):
        return False
    if iteration >= train.iterations or evaluation_due(settings, iteration) \
            or (league.enabled and iteration % league.snapshot_every == 0):
        return False
    return not loads_checkpoints(engine, lora=settings.model.lora is not None)


def pushes_weights(settings: Settings) -> bool:
    """Whether each update's full weights reach the run's rollout workers in other processes
    through memory, not a checkpoint read back (``tasks.ray.rollouts.push_weights``): long-lived
    worker actors on Ray, full fine-tuning, and ``hf``, or ``vllm`` with
    ``engine.vllm.weight_sync=memory``. A LoRA adapter goes by its checkpoint's path."""
    flow = settings.flow
    return (flow.runner == "ray" and flow.ray.long_lived_workers and settings.model.lora is None
            and takes_weights_in_memory(settings.engine))


def evaluation_due(settings: Settings, iteration: int) -> bool:
    every = settings.train.eval_every
    return bool(every) and iteration % every == 0


def train(settings: Settings, run_steps: Steps | None = None, *, progress: bool = True, stop_after: int | None = None,
          on_iteration: Callable[[RunResult], None] | None = None) -> RunResult:
    """Run (or resume) ``run.name`` to ``train.iterations`` iterations; see the module docstring.

    ``run_steps``: how the steps run (default: here, with progress bars if ``progress``; its
    settings must be these); ``stop_after`` ends this call after that many iterations (the run
    is not shortened: a later call resumes it); ``on_iteration`` is called after each
    iteration is recorded (its ``result.checkpoint`` may still be being written behind: its
    files are on disk when :func:`train` returns)."""
    if run_steps is not None and run_steps.settings is not settings:
        raise ValueError("run_steps runs other settings than the run's: build it from the same Settings")
    run_steps = run_steps if run_steps is not None else Steps(settings, progress)
    layout = RunLayout.of(settings)
    result = RunResult(settings)
    with layout.writing():
        run_steps.prepare()
        state = run_steps.start(resume_point(settings, layout))
        result.resumed_from = result.checkpoint = state.checkpoint
        live = None
        ahead: tuple[list[pl.DataFrame], list[RolloutStats]] | None = None  # the next iteration's, played behind
        try:
            # what a crashed or stopped call recorded after its newest checkpoint is computed again
            kept = record.keep_up_to(layout, state.iteration)
            live = record.LiveMetrics(settings.paths.live, kept) if settings.paths.live else None
            if state.checkpoint is not None and evaluation_due(settings, state.iteration) \
                    and not evaluated(settings, state.checkpoint):  # stopped during its evaluation
                result.evaluations[state.iteration] = run_steps.evaluate(state)
            for iteration in range(state.iteration + 1, settings.train.iterations + 1):
                if stop_after is not None and len(result.iterations) >= stop_after:
                    break
                if ahead is not None:  # played behind the update before
                    tables, stats = ahead
                    ahead = None
                else:
                    tables, stats = first_rollout(settings, run_steps, state, iteration)
                table = run_steps.score(tables, iteration)
                behind = None
                if settings.train.max_staleness and iteration < settings.train.iterations:
                    behind = run_steps.rollout_behind(state, iteration + 1)
                try:
                    update = run_steps.update(state, table, iteration)
                    if behind is not None:  # before checkpoint k: a resume from it trains on this table
                        ahead = behind.result()
                        steps.keep_ahead(settings, iteration + 1, *ahead)
                except BaseException:
                    if behind is not None and ahead is None:  # no thread is left playing; a resume plays it again
                        abandon(behind, iteration + 1)
                    raise
                metrics, performance = record.iteration_records(iteration, table, update, stats)
                metrics |= steps.advance_league(settings, table, iteration)
                # recorded before the checkpoint: a run resumes at a checkpoint whose line is written
                recorded = record.append_record(layout.metrics, metrics)
                record.append_record(layout.performance, performance)
                if checkpoint_due(settings, iteration):
                    before = result.checkpoint
                    result.checkpoint = run_steps.save(state, metrics, writes_behind(settings, iteration))
                    if settings.train.max_staleness and before is not None:
                        # a resume starts at the checkpoint before at the earliest (this one may
                        # still be being written): the rollouts kept for iterations up to it are done with
                        steps.drop_ahead(settings, before.iteration)
                warning = record.drift_warning(settings.train, metrics, recorded[0])
                result.iterations.append(iteration)
                result.history = record.history(layout)
                if warning:
                    result.drift_warnings[iteration] = warning
                run_steps.report(performance | metrics, warning, result.history)
                if live is not None:
                    live.log(performance | metrics)
                if evaluation_due(settings, iteration):
                    result.evaluations[iteration] = run_steps.evaluate(state)
                    for split, final in result.evaluations[iteration].items():
                        run_steps.reported_evaluation(iteration, split, final)
                if on_iteration is not None:
                    on_iteration(result)
            state.wait_for_checkpoint()  # a call stopped early (stop_after) ends with its checkpoint on disk
            result.checkpoint = state.checkpoint  # the same checkpoint, its files in the manifest
            if result.finished:
                layout.write_final(result.checkpoint, settings.train.iterations)
        finally:
            if live is not None:
                live.close()
            state.close()
    result.history = record.history(layout)
    return result


def first_rollout(settings: Settings, run_steps: Steps, state: TrainingState,
                  iteration: int) -> tuple[list[pl.DataFrame], list[RolloutStats]]:
    """The rollout of a call's first iteration (every iteration's, at ``train.max_staleness`` 0),
    from the weights as they are. Behind the update, the run's first iteration plays from the
    starting weights too; a later one, after a resume, was played behind the update before the
    checkpoint and kept (:func:`mage.run.steps.kept_ahead`), and is trained on as it was."""
    if settings.train.max_staleness and state.iteration > 0:
        kept = steps.kept_ahead(settings, iteration, policy_version=state.iteration - 1)
        if kept is not None:
            return kept
        logger.warning(f"iteration {iteration}: its rollout, played behind update {state.iteration}, is not in the run "
                       f"({RunLayout.of(settings).rollout_shard(iteration, 0).parent}): it plays again from "
                       f"checkpoint {state.iteration}'s weights, one version newer, so the run does not continue "
                       "exactly as it would have")
    return run_steps.rollout(state, iteration)


def abandon(behind: Ahead, iteration: int) -> None:
    """Stop a rollout behind an update that failed, and wait for it (its table is of no use: the
    run resumes from a checkpoint before that update): it is asked to stop at its next step
    (:mod:`mage.stopping`), and what ended it is logged, not raised."""
    asked = stopping.requested()  # a flow's own ask stays for the flow to withdraw
    stopping.request()
    try:
        behind.result()
    except BaseException as error:  # noqa: BLE001 - the update's error is the one raised
        logger.info(f"the rollout of iteration {iteration}, behind the failed update, ended with: {error!r}")
    finally:
        if not asked:
            stopping.clear()


def evaluated(settings: Settings, checkpoint: ckpt.Checkpoint) -> bool:
    """Whether ``checkpoint``'s evaluation during training is written (every split's record)."""
    directory = evaluation_dir(settings, checkpoint.path)
    return all((directory / f"{split}-metrics.json").is_file() for split in splits_of(settings.eval.split))


def resume_point(settings: Settings, layout: RunLayout) -> ckpt.Checkpoint | None:
    """The newest complete checkpoint of ``layout``'s run (of iteration ``train.iterations`` or
    before) if the run was made with the same identity (``run.json``); else None, after moving
    the other configuration's run, and its evaluations, aside."""
    identity = reads.run_identity(settings)
    recorded = _recorded_identity(layout)
    if layout.identity.is_file() or ckpt.latest_checkpoint(layout.checkpoints) is not None:
        if recorded != identity:
            stamp = time.strftime("%Y%m%dT%H%M%S")
            moved = [_aside(path, stamp) for path in (layout.root, evaluation_dir(settings, "ckpt").parent)
                     if path.exists()]
            changed = differences(recorded, identity) if recorded is not None else \
                f"{layout.identity.name} is missing or unreadable"
            logger.warning(f"run {layout.name!r} was made with other settings ({changed}): it is moved to "
                           f"{' and '.join(map(str, moved))}, and the run starts again at iteration 1 (delete "
                           "that once it is not needed, or give this configuration its own run.name)")
    io.write_json(layout.identity, {"identity": identity})
    return ckpt.latest_checkpoint(layout.checkpoints, at_most=settings.train.iterations)


def _aside(path: Path, stamp: str) -> Path:
    """Rename ``path`` to ``<name>.replaced-<stamp>`` (``-2``, ``-3``, ... if that exists)."""
    target, number = path.with_name(f"{path.name}.replaced-{stamp}"), 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.replaced-{stamp}-{number}")
    path.rename(target)
    return target


def _recorded_identity(layout: RunLayout) -> dict[str, Any] | None:
    try:
        recorded = io.read_json(layout.identity).get("identity") if layout.identity.is_file() else None
    except (io.CorruptFileError, AttributeError):
        return None
    return recorded if isinstance(recorded, dict) else None


def differences(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> str:
    """The keys whose values differ between two nested mappings, as ``key: old -> new``."""
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        name = f"{prefix}{key}"
        if isinstance(old, dict) and isinstance(new, dict):
            inner = differences(old, new, f"{name}.")
            out += [inner] if inner else []
        elif old != new:
            out.append(f"{name}: {old!r} -> {new!r}")
    return "; ".join(out)


def describe_iteration(metrics: dict[str, Any]) -> str:
    """One log line per iteration: what a researcher watches while training runs."""
    opponents = sorted({key.split("/")[1] for key in metrics if key.startswith("rollout/") and key.count("/") == 2
                        and key.endswith("final_win_rate")} - {"all"})
    per_opponent = ", ".join(f"{o} {metrics[f'rollout/{o}/final_win_rate']:.2f}" for o in opponents)
    nan = float("nan")
    return (
        f"iteration {metrics['iteration']}: final-episode return {metrics.get('rollout/all/final_mean_return', nan):+.2f}, "
        f"win rate {metrics.get('rollout/all/final_win_rate', nan):.2f} ({per_opponent}); "
        f"invalid {metrics.get('rollout/invalid_rate', nan):.3f}; loss {metrics.get('train/loss', nan):+.4f}, "
        f"KL {metrics.get('train/kl', nan):.4f}; "
        + (f"exploitability {metrics['train/exploitability']:.3f} per episode; " if "train/exploitability" in metrics
           else "")
        + f"rollout {metrics.get('rollout/meta_episodes_per_second', 0):.1f} "
        f"meta-episodes/s, update {metrics.get('train/tokens_per_second', 0):.0f} tokens/s"
    )
