"""The steps of a training run, each a plain function (what each reads: :mod:`mage.run.reads`).

    seed_population, prepare_model                      once, before training (mage.population.manifest, mage.warmstart)
    rollout -> score -> update -> (save) -> (evaluate)  every iteration (:mod:`mage.run.loop`)
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from mage import io
from mage.algo import Penalties, add_advantages, add_returns
from mage.backends import Backend
from mage.config.sections import PopulationEntry
from mage.evaluation import exploitability as exact_exploitability
from mage.evaluation.play import write_evaluation
from mage.models import checkpoint as ckpt
from mage.population import league
from mage.rollout import (MetaEpisodeSpec, RolloutEngine, RolloutStats, plan_meta_episodes, read_trajectories,
                          write_trajectories)
from mage.run import record
from mage.run.layout import RunLayout, evaluation_dir
from mage.run.reads import identity_hash
from mage.run.snapshots import LeagueSnapshots
from mage.run.state import TrainingState
from mage.run.worker import RolloutWorker
from mage.settings import Settings
from mage.tensors import derive_seed

logger = logging.getLogger(__name__)


# -- the steps ------------------------------------------------------------------------------
def league_state(settings: Settings, iteration: int) -> league.LeagueState:
    """The league as ``iteration`` starts: the record of the iteration before it
    (``league.jsonl``), or none yet (:meth:`mage.population.league.LeagueState.start`)."""
    records = [r for r in io.read_json_lines(RunLayout.of(settings).league, record.METRICS_REMEDY)
               if r.get("iteration", 0) < iteration]
    if records:
        return league.LeagueState.from_json(records[-1])
    return league.LeagueState.start(list(settings.population.train.values()))


def training_population(settings: Settings, iteration: int,
                        state: league.LeagueState | None = None) -> list[PopulationEntry]:
    """What ``iteration`` draws its opponents from: the training population, and with
    ``population.league`` the league's snapshots (:func:`mage.population.league.training_entries`) of
    ``state`` (default: :func:`league_state`, read from the run)."""
    scripted = list(settings.population.train.values())
    if not settings.population.league.enabled:
        return scripted
    state = state if state is not None else league_state(settings, iteration)
    return league.training_entries(scripted, state, settings.population.league, settings.game.name)


def plan(settings: Settings, iteration: int, state: league.LeagueState | None = None) -> list[MetaEpisodeSpec]:
    """The meta-episodes of an iteration: groups drawn from the training population (and the
    league's snapshots, :func:`training_population`)."""
    engine = settings.engine
    return plan_meta_episodes(
        training_population(settings, iteration, state), engine.groups, engine.group_size,
        derive_seed(settings.seed, iteration), settings.population.seat_split, settings.game.num_players,
        mixed=settings.algo.grouping == "mixed",
    )


def shard_specs(specs: Sequence[MetaEpisodeSpec], shard: int, shards: int) -> list[MetaEpisodeSpec]:
    """Shard ``shard`` of ``shards``: whole groups, dealt round-robin (groups stay together
    so a shard's rows can be scored with the others' after they are concatenated)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be in [0, {shards}), got {shard}")
    return [s for s in specs if s.group_id % shards == shard]


def rollout(settings: Settings, backend: Backend, iteration: int, shard: int = 0, progress: bool = True, *,
            snapshots: LeagueSnapshots, policy_version: int | None = None) -> tuple[pl.DataFrame, RolloutStats]:
    """Play shard ``shard`` of this iteration's meta-episodes (of ``flow.rollout_shards``)
    against the training population with ``backend``; the league's snapshots play from
    ``snapshots``, the player's (its :class:`~mage.run.state.TrainingState` or
    :class:`~mage.run.worker.RolloutWorker`), which keeps them loaded between iterations.
    ``policy_version``: the updates ``backend``'s weights have seen (default ``iteration`` - 1,
    the weights of a loop that alternates; a rollout behind the update passes its own)."""
    shards = settings.flow.rollout_shards
    state = league_state(settings, iteration) if settings.population.league.enabled else None  # read once
    specs = shard_specs(plan(settings, iteration, state), shard, shards)
    engine = RolloutEngine(backend, settings.engine, settings.game.params,
                           opponents=snapshots.backends(RunLayout.of(settings).root,
                                                        state.members if state is not None else ()))
    # One sampling seed per (iteration, shard): a re-run draws the same replies.
    sampling = replace(settings.engine.sampling, seed=derive_seed(settings.seed, iteration, shard))
    version = iteration - 1 if policy_version is None else policy_version
    table = engine.run(specs, sampling, run_id=settings.run_name, iteration=iteration, progress=progress,
                       policy_version=version)
    return table, engine.last_stats


def keep_ahead(settings: Settings, iteration: int, tables: Sequence[pl.DataFrame], stats: Sequence[RolloutStats]) -> None:
    """Write the shards of ``iteration``'s rollout, played behind the update before it
    (``train.max_staleness``), where a resumed run finds them (:func:`kept_ahead`): the weights
    they were sampled from are not the checkpoint's, so the run could not play them again."""
    layout = RunLayout.of(settings)
    for shard, (table, played) in enumerate(zip(tables, stats, strict=True)):
        path = layout.rollout_shard(iteration, shard)
        write_trajectories(table, path)
        io.write_json(path.with_suffix(".stats.json"), dict(played.__dict__))


def drop_ahead(settings: Settings, up_to: int) -> None:
    """Delete what :func:`keep_ahead` kept for iterations up to ``up_to``: no resume reads them."""
    shards = RunLayout.of(settings).rollout_shard(1, 0).parent
    for path in shards.glob("iteration-*-shard-*"):
        try:
            iteration = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if iteration <= up_to:
            path.unlink(missing_ok=True)


def kept_ahead(settings: Settings, iteration: int,
               policy_version: int) -> tuple[list[pl.DataFrame], list[RolloutStats]] | None:
    """The shards :func:`keep_ahead` wrote for ``iteration``, if all of them are there, whole,
    and sampled from ``policy_version``; else None."""
    layout = RunLayout.of(settings)
    tables, stats = [], []
    for shard in range(settings.flow.rollout_shards):
        path = layout.rollout_shard(iteration, shard)
        try:
            table = read_trajectories(path)
            played = RolloutStats(**io.read_json(path.with_suffix(".stats.json")))
        except (OSError, ValueError, TypeError, pl.exceptions.PolarsError):  # missing, cut short, or another schema
            return None
        if table.is_empty() or set(table["policy_version"].unique().to_list()) != {policy_version} \
                or set(table["iteration"].unique().to_list()) != {iteration}:
            return None
        tables.append(table)
        stats.append(played)
    return tables, stats


def advance_league(settings: Settings, table: pl.DataFrame, iteration: int) -> dict[str, float]:
    """With ``population.league``: the league after ``iteration`` (its ratings updated from the
    iteration's ``table``; a snapshot of this iteration's checkpoint joining when one is due),
    recorded in ``league.jsonl``; returns its metrics (:func:`mage.population.league.league_metrics`)."""
    settings_league = settings.population.league
    if not settings_league.enabled:
        return {}
    layout = RunLayout.of(settings)
    before = league_state(settings, iteration)
    entries = training_population(settings, iteration, before)  # what the iteration was dealt from
    joining = layout.checkpoint(iteration).relative_to(layout.root).as_posix()  # the run folder may move
    after = league.advanced(before, table, iteration, joining, settings_league)
    record.append_record(layout.league, {"iteration": iteration, **after.to_json()})
    return league.league_metrics(after, entries)


def play_shard(worker: RolloutWorker, iteration: int, checkpoint: str | Path | None,
               shard: int, weights: str | None = None) -> tuple[Path, RolloutStats]:
    """:func:`rollout` by a worker outside the trainer's process, sampling from
    ``checkpoint`` (with its ``weights``: :meth:`RolloutWorker.sample_from`); the shard's table
    is written where the run keeps shard tables."""
    settings = worker.settings
    table, stats = rollout(settings, worker.sample_from(checkpoint, weights), iteration, shard, progress=False,
                           snapshots=worker.snapshots)
    return write_trajectories(table, RunLayout.of(settings).rollout_shard(iteration, shard)), stats


def score(settings: Settings, tables: Sequence[pl.DataFrame], iteration: int) -> pl.DataFrame:
    """The iteration's table (its shards together) with returns and advantages, written to
    ``rollouts/iteration-<k>.parquet``."""
    penalties = Penalties(invalid=settings.game.invalid_penalty, length=settings.game.length_penalty,
                          max_response_tokens=settings.engine.sampling.max_new_tokens)
    table = pl.concat(list(tables)) if len(tables) > 1 else tables[0]
    scored = add_advantages(add_returns(table, settings.algo, penalties), settings.algo)
    write_trajectories(scored, RunLayout.of(settings).rollout(iteration))
    return scored


def update(state: TrainingState, table: pl.DataFrame, iteration: int) -> dict[str, float]:
    """One PPO update on a scored table. Its seed and learning rate follow the iteration, so a
    resumed run replays the same update; a vLLM engine in this process sleeps meanwhile (its
    GPU memory goes to the trainer), then gets the new weights through memory where it takes
    them so, checked (``weight_sync_gap_max``; :meth:`TrainingState.synced`). Where it is measured
    the metrics hold the updated policy's exploitability (:func:`exploitability`)."""
    settings = state.settings
    state.wait_for_checkpoint()  # a checkpoint written behind reads the weights this changes
    with state.engine_asleep():
        # the weights as update k starts have seen k - 1 updates: rows sampled from fewer are stale
        metrics = state.trainer.update(table, seed=derive_seed(settings.seed, iteration, 1),
                                       learning_rate=settings.train.learning_rate_at(iteration),
                                       policy_version=iteration - 1)
    state.iteration = iteration
    metrics.update(state.synced(table))
    metrics.update(exploitability(state))
    return metrics


def exploitability(state: TrainingState) -> dict[str, float]:
    """Where it is measured (Kuhn Poker, or an OpenSpiel game small enough: Leduc, liar's dice,
    Goofspiel; played by a model): the exploitability of the policy in memory and its value
    against a best response, in the game's payoff per episode (:mod:`mage.evaluation.exploitability`);
    else {}. Part of :func:`update` (``train.workers=1``): with Ray Train's workers the flow's
    process holds the weights in host memory only, where Kuhn's 24 forward passes of a 4B model
    would take minutes; the evaluations still measure each checkpoint they load. Its cost grows
    with the game: one forward pass per legal move of every information state (Kuhn 24, Leduc
    2,184, liar's dice 2,040, Goofspiel 186; BENCHMARKS.md, "Exact exploitability: its cost per game")."""
    settings = state.settings
    if not exact_exploitability.measured(settings):
        return {}
    found = exact_exploitability.of_run_policy(settings, exact_exploitability.policy_scorer(
        state.policy, settings.model.chat, settings.model.enable_thinking))
    return {"exploitability": found["exploitability"], "value_vs_best_response": found["value_vs_best_response"]["mean"]}


def save(state: TrainingState, metrics: dict[str, Any], behind: bool = False) -> ckpt.Checkpoint:
    """Checkpoint the current weights, optimizer and RNG state (the rollouts go on with it),
    then keep the newest ``train.keep_checkpoints`` of those up to it (a longer run's later
    ones, left by a run shortened since, are not counted or touched), and the one
    ``final.json`` names, and any an evaluation holds. ``behind``: the files are written on
    the state's writer thread (:meth:`TrainingState.write_behind`), for a checkpoint that
    nothing reads before the next update (:func:`mage.run.loop.writes_behind`)."""
    settings = state.settings
    layout = RunLayout.of(settings)
    state.wait_for_checkpoint()  # one write at a time, in order
    saved, write = ckpt.checkpoint_writer(
        layout.checkpoints, state.iteration, state.policy, state.trainer.optimizer,
        config_hash=identity_hash(settings),
        parent=str(state.checkpoint.path) if state.checkpoint else None, metrics=metrics,
        sharded_state=state.sharded_state,
    )
    sharded_state = state.sharded_state
    final = layout.final_checkpoint() if layout.final.is_file() else None  # a longer run's earlier end
    snapshots = [layout.root / m.checkpoint for m in league_state(settings, state.iteration + 1).members] \
        if settings.population.league.enabled else []  # the league plays them
    iteration = state.iteration

    def write_and_prune() -> ckpt.Checkpoint:
        written = write()
        if sharded_state is not None:  # moved into the checkpoint: its staging folder is empty now
            shutil.rmtree(sharded_state.parent, ignore_errors=True)
            state.sharded_state = None  # only now: a failed write keeps it, and a retry takes it
        try:
            ckpt.prune_checkpoints(layout.checkpoints, settings.train.keep_checkpoints, up_to=iteration,
                                   protect=([final] if final is not None else []) + snapshots)
        except OSError as error:  # the checkpoint is written (a retry must not write it again): older ones stay
            logger.warning(f"checkpoint {written.path} is written; removing older ones failed ({error}), the next "
                           f"checkpoint tries again")
        return written

    if behind:  # the checkpoint without its files until written (TrainingState.wait_for_checkpoint)
        state.checkpointed(saved)
        state.write_behind(write_and_prune)
        return saved
    written = write_and_prune()
    state.checkpointed(written)
    return written


def evaluate(settings: Settings, checkpoint: ckpt.Checkpoint | None, split: str, out_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; the
    table and its record go to ``out_dir`` (default: the run's folder for that checkpoint)."""
    directory = out_dir if out_dir is not None else evaluation_dir(settings, checkpoint.path if checkpoint else None)
    return write_evaluation(settings, checkpoint, split, directory, progress=progress)
