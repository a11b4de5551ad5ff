"""The steps of the lifecycle, each a plain function, and the settings each one reads.

    seed_population, prepare_model                      once, before training
    rollout -> score -> update -> (save) -> (evaluate)  every iteration (:mod:`mage.run.loop`)
    finish                                              final.json, once every iteration is done

:data:`READS` declares, once, the settings each step reads (dotted keys of the composed
config). Everything that depends on a step's settings is derived from it: the Prefect tasks'
cache keys (``tasks.caching``), the run's identity that decides whether a run directory can be
resumed (:func:`run_identity`), the warm-start build's key and DVC's ``params`` (a test checks
``dvc.yaml`` against it). ``tests/test_step_reads.py`` runs each step on the tiny preset while
recording every setting it touches, and checks the declarations against what it saw.
"""

from __future__ import annotations

import hashlib
import json
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
from mage.run.state import RolloutWorker, TrainingState
from mage.sections import splits_of
from mage.settings import Settings, select
from mage.tensors import derive_seed
from mage.train import checkpoint as ckpt

#: The settings each step reads. A whole section stands for every key under it.
READS: dict[str, tuple[str, ...]] = {
    # the population manifest: every entry's ceilings per seat
    "seed_population": ("game.name", "game.params", "population", "paths.population_manifest"),
    # the base model: the tiny preset's build (cloned on the training population, checked against
    # every opponent with the manifest's ceilings beside) or a hub model's download
    "prepare_model": ("model", "game.name", "game.params", "population", "paths.population_manifest"),
    # the policy, its trainer and the backend that samples from it
    "start": ("model", "train", "algo.kl_coef", "engine.backend", "engine.hf", "engine.vllm", "engine.scripted",
              "engine.sampling.temperature", "seed"),
    # one shard of an iteration's meta-episodes (the shard count sets the sampling seeds)
    "rollout": ("engine", "game.name", "game.params", "population.train", "population.seat_split",
                "algo.grouping", "model", "seed", "train.seed", "run.name", "paths.runs", "flow.rollout_shards"),
    # returns and advantages of the iteration's table
    "score": ("algo", "game.invalid_penalty", "game.length_penalty", "engine.sampling.max_new_tokens", "run.name",
              "paths.runs"),
    # one PPO update, and the checkpoint after it (its manifest records the run's identity)
    "update": ("train", "algo", "seed", "model.build", "run.name", "paths.runs"),
    # a checkpoint against one split's opponents, and the record of what played it
    "evaluate": ("eval", "engine", "game.name", "game.params", "population.train", "population.held_out",
                 "population.seat_split", "model", "run.name", "paths.evaluations",
                 "paths.start_evaluation", "seed"),
    # the report of evaluation tables beside the starting policy's
    "report": ("run.name", "eval.episodes", "eval.early_stop", "eval.sampling", "game.name", "model"),
    # the loop itself (mage.run.loop), besides the steps it runs (LOOP_STEPS): how many iterations,
    # when to checkpoint and evaluate, what to keep, when to warn, how many shards, where it writes
    "loop": ("train.iterations", "train.checkpoint_every", "train.eval_every", "train.drift_invalid_rise",
             "train.drift_kl", "eval.split", "flow.rollout_shards", "run.name", "paths.runs", "paths.live"),
}
#: The steps the loop runs.
LOOP_STEPS = ("prepare_model", "start", "rollout", "score", "update", "evaluate")

#: What only schedules the steps (the loop's reads, and how many checkpoints the update keeps):
#: none changes what an iteration computes, so a run lengthened or checkpointed more often
#: resumes instead of starting again.
SCHEDULE = ("train.iterations", "train.checkpoint_every", "train.eval_every", "train.keep_checkpoints",
            "train.drift_invalid_rise", "train.drift_kl")


def values_of(settings: Settings, keys: Sequence[str], ignore: Sequence[str] = ()) -> dict[str, Any]:
    """The values of ``keys`` (dotted) in the composed config, without the sub-keys in ``ignore``."""
    import copy

    chosen = {key: copy.deepcopy(select(settings.raw, key)) for key in sorted(set(keys))}
    for dotted in ignore:
        for key, value in chosen.items():
            if dotted.startswith(key + "."):
                _drop(value, dotted[len(key) + 1:])
        chosen.pop(dotted, None)
    return chosen


def _drop(node: Any, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def run_identity(settings: Settings) -> dict[str, Any]:
    """The settings a run's iterations depend on: what the steps of an iteration read, less
    where files go (``paths``, the run's name, where the base model lies) and the schedule.
    A run directory resumes only under the same identity (``run.json``)."""
    keys = {key for step in ("start", "rollout", "score", "update") for key in READS[step]}
    keys = {key for key in keys if not key.startswith(("paths.", "run."))}
    ignore = [*SCHEDULE, "model.local_dir"]
    if settings.train.lr_schedule == "linear":  # the rate of every iteration depends on how many there are
        ignore.remove("train.iterations")
    if settings.model.build == "tiny":  # a preset is named by its settings; its path is only where it lies
        ignore.append("model.path")
    return values_of(settings, sorted(keys), ignore)


def identity_hash(settings: Settings) -> str:
    """A short hash of :func:`run_identity` (what checkpoint manifests record)."""
    text = json.dumps(run_identity(settings), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    GPU memory goes to the trainer)."""
    settings = state.settings
    backend = state._backend
    if backend is not None:
        backend.sleep()
    try:
        metrics = state.trainer.update(table, seed=derive_seed(settings.seed, iteration, 1),
                                       learning_rate=settings.train.learning_rate_at(iteration))
    finally:
        if backend is not None:
            backend.wake_up()
    state.iteration = iteration
    return metrics


def save(state: TrainingState, metrics: dict[str, Any]) -> ckpt.Checkpoint:
    """Checkpoint the current weights, optimizer and RNG state (the rollouts go on with it),
    then keep the newest ``train.keep_checkpoints``."""
    settings = state.settings
    layout = RunLayout.of(settings)
    saved = ckpt.save_checkpoint(
        layout.checkpoints, state.iteration, state.policy, state.trainer.optimizer,
        config_hash=identity_hash(settings),
        parent=str(state.checkpoint.path) if state.checkpoint else None, metrics=metrics,
    )
    ckpt.prune_checkpoints(layout.checkpoints, settings.train.keep_checkpoints)
    state.checkpointed(saved)
    return saved


def evaluate(settings: Settings, checkpoint: ckpt.Checkpoint | None, split: str, out_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; the
    table and its record go to ``out_dir`` (default: the run's folder for that checkpoint)."""
    directory = out_dir if out_dir is not None else evaluation_dir(settings, checkpoint.path if checkpoint else None)
    return write_evaluation(settings, checkpoint, split, directory, progress=progress)


def evaluation_splits(settings: Settings) -> tuple[str, ...]:
    """The splits an evaluation during training plays (``eval.split``)."""
    return splits_of(settings.eval.split)
