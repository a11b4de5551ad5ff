"""The steps of a training run, each a plain function (what each reads: :mod:`mage.run.reads`).

    seed_population, prepare_model                      once, before training (mage.population, mage.build)
    rollout -> score -> update -> (save) -> (evaluate)  every iteration (:mod:`mage.run.loop`)
"""

from __future__ import annotations

import shutil

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from mage.algo import Penalties, add_advantages, add_returns
from mage.backends import Backend
from mage.evaluation import write_evaluation
from mage.rollout import MetaEpisodeSpec, RolloutEngine, RolloutStats, plan_meta_episodes, write_trajectories
from mage.run.layout import RunLayout, evaluation_dir
from mage.run.reads import identity_hash
from mage.run.state import RolloutWorker, TrainingState
from mage.settings import Settings
from mage.tensors import derive_seed
from mage.train import checkpoint as ckpt


# -- the steps ------------------------------------------------------------------------------
def plan(settings: Settings, iteration: int) -> list[MetaEpisodeSpec]:
    """The meta-episodes of an iteration: groups drawn from the training population."""
    engine = settings.engine
    return plan_meta_episodes(
        list(settings.population.train.values()), engine.groups, engine.group_size,
        derive_seed(settings.seed, iteration), settings.population.seat_split, settings.game.num_players,
        mixed=settings.algo.grouping == "mixed",
    )


def shard_specs(specs: Sequence[MetaEpisodeSpec], shard: int, shards: int) -> list[MetaEpisodeSpec]:
    """Shard ``shard`` of ``shards``: whole groups, dealt round-robin (groups stay together
    so a shard's rows can be scored with the others' after they are concatenated)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be in [0, {shards}), got {shard}")
    return [s for s in specs if s.group_id % shards == shard]


def rollout(settings: Settings, backend: Backend, iteration: int, shard: int = 0,
            progress: bool = True) -> tuple[pl.DataFrame, RolloutStats]:
    """Play shard ``shard`` of this iteration's meta-episodes (of ``flow.rollout_shards``)
    against the training population with ``backend``."""
    shards = settings.flow.rollout_shards
    specs = shard_specs(plan(settings, iteration), shard, shards)
    engine = RolloutEngine(backend, settings.engine, settings.game.params)
    # One sampling seed per (iteration, shard): a re-run draws the same replies.
    sampling = replace(settings.engine.sampling, seed=derive_seed(settings.seed, iteration, shard))
    table = engine.run(specs, sampling, run_id=settings.run_name, iteration=iteration, progress=progress)
    return table, engine.last_stats


def play_shard(worker: RolloutWorker, iteration: int, checkpoint: str | Path | None,
               shard: int) -> tuple[Path, RolloutStats]:
    """:func:`rollout` by a worker outside the trainer's process, sampling from
    ``checkpoint``; the shard's table is written where the run keeps shard tables."""
    settings = worker.settings
    table, stats = rollout(settings, worker.sample_from(checkpoint), iteration, shard, progress=False)
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
    them so, checked (``weight_sync_gap_max``; :meth:`TrainingState.synced`)."""
    settings = state.settings
    with state.engine_asleep():
        metrics = state.trainer.update(table, seed=derive_seed(settings.seed, iteration, 1),
                                       learning_rate=settings.train.learning_rate_at(iteration))
    state.iteration = iteration
    metrics.update(state.synced(table))
    return metrics


def save(state: TrainingState, metrics: dict[str, Any]) -> ckpt.Checkpoint:
    """Checkpoint the current weights, optimizer and RNG state (the rollouts go on with it),
    then keep the newest ``train.keep_checkpoints`` of those up to it (a longer run's later
    ones, left by a run shortened since, are not counted or touched), and the one
    ``final.json`` names, and any an evaluation holds."""
    settings = state.settings
    layout = RunLayout.of(settings)
    saved = ckpt.save_checkpoint(
        layout.checkpoints, state.iteration, state.policy, state.trainer.optimizer,
        config_hash=identity_hash(settings),
        parent=str(state.checkpoint.path) if state.checkpoint else None, metrics=metrics,
        sharded_state=state.sharded_state,
    )
    if state.sharded_state is not None:  # moved into the checkpoint: its staging folder is empty now
        shutil.rmtree(state.sharded_state.parent, ignore_errors=True)
        state.sharded_state = None
    final = layout.final_checkpoint() if layout.final.is_file() else None  # a longer run's earlier end
    ckpt.prune_checkpoints(layout.checkpoints, settings.train.keep_checkpoints, up_to=state.iteration,
                           protect=[final] if final is not None else [])
    state.checkpointed(saved)
    return saved


def evaluate(settings: Settings, checkpoint: ckpt.Checkpoint | None, split: str, out_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; the
    table and its record go to ``out_dir`` (default: the run's folder for that checkpoint)."""
    directory = out_dir if out_dir is not None else evaluation_dir(settings, checkpoint.path if checkpoint else None)
    return write_evaluation(settings, checkpoint, split, directory, progress=progress)
