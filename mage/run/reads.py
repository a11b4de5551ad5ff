"""What each step of a run reads, declared once, and what is derived from it.

:data:`READS` names, per step, the settings it reads (dotted keys of the composed config; a
whole section stands for every key under it). Everything that depends on a step's settings
is derived from it:

* the Prefect tasks' cache keys (``tasks.caching``: a task keys on its step's reads);
* the rollout worker a process keeps (``tasks.worker``);
* the run's identity (:func:`run_identity`, ``run.json``): a run resumes only under it;
* the warm-start build's key (``prepare_model``);
* DVC's ``params`` (``tests/test_dvc_dependencies.py`` checks each stage's against them).

``tests/test_step_reads.py`` runs every step on the tiny preset while recording every setting
it touches, and checks these declarations against what it saw, both ways. This module imports
no torch: the tasks that only key on it start quickly.
"""

from __future__ import annotations

from typing import Any

from mage.settings import Settings

READS: dict[str, tuple[str, ...]] = {
    # the population manifest: every entry's ceilings per seat
    "seed_population": ("game.name", "game.params", "population", "paths.population_manifest"),
    # the base model: the tiny preset's build (cloned on the training population, checked against
    # every opponent with the manifest's ceilings beside) or a hub model's download
    "prepare_model": ("model", "game.name", "game.params", "population", "paths.population_manifest"),
    # the policy, its trainer and the backend that samples from it
    # (the run's folder: train.workers > 1 continues a one-process checkpoint from a state written beside it)
    "start": ("model", "train", "algo.kl_coef", "engine.backend", "engine.hf", "engine.vllm", "engine.scripted",
              "engine.sampling.temperature", "seed", "run.name", "paths.runs"),
    # one shard of an iteration's meta-episodes (the shard count sets the sampling seeds)
    "rollout": ("engine", "game.name", "game.params", "population.train", "population.seat_split",
                "population.league", "algo.grouping", "model", "seed", "train.seed", "run.name", "paths.runs",
                "flow.rollout_shards"),
    # the league after an iteration: ratings from its table, a snapshot joining (population.league)
    "league": ("population.league", "population.train", "game.name", "run.name", "paths.runs"),
    # returns and advantages of the iteration's table
    "score": ("algo", "game.invalid_penalty", "game.length_penalty", "engine.sampling.max_new_tokens", "run.name",
              "paths.runs"),
    # one PPO update, and the checkpoint after it (its manifest records the run's identity)
    # (and, where it is measured, the updated policy's exploitability: mage.evaluation.exploitability)
    "update": ("train", "algo", "seed", "model.build", "run.name", "paths.runs", "population.league",
               "game.name", "game.params", "engine.backend", "engine.episodes", "engine.context_mode",
               "population.seat_split", "model.chat", "model.enable_thinking"),
    # a checkpoint against one split's opponents, and the record of what played it
    "evaluate": ("eval", "engine", "game.name", "game.params", "population.train", "population.held_out",
                 "population.seat_split", "model", "run.name", "paths.evaluations",
                 "paths.start_evaluation", "seed"),
    # the exploitability of a checkpoint or the starting policy in an evaluation (where it is measured)
    # (mage.evaluation.exploitability, through the evaluation's backend; the trainer's is the update's)
    "exploitability": ("engine", "game.name", "game.params", "population.seat_split", "model", "seed"),
    # the report of evaluation tables beside the starting policy's, and of the training rollouts
    # (at their sampling temperature), with what it says it is about (mage.run.evaluation.report_about:
    # the run, the game, the starting model, the sampling)
    "report": ("run.name", "eval.episodes", "eval.early_stop", "eval.sampling", "engine.sampling.temperature",
               "game.name", "model"),
    # the loop itself (mage.run.loop), besides the steps it runs (LOOP_STEPS): how many iterations,
    # when to checkpoint and evaluate, when to warn, how many shards, where it writes, and which
    # checkpoints it writes behind the next rollout (what would read them first), and whether the
    # next rollout plays behind the update
    "loop": ("train.iterations", "train.checkpoint_every", "train.eval_every", "train.drift_invalid_rise",
             "train.drift_kl", "eval.split", "flow.rollout_shards", "run.name", "paths.runs", "paths.live",
             "population.league", "train.write_behind", "train.workers", "flow.runner", "engine.backend",
             "engine.vllm.weight_sync", "model.lora", "train.max_staleness"),
}
#: The steps the loop runs.
LOOP_STEPS = ("prepare_model", "start", "rollout", "score", "update", "league", "evaluate")
#: The steps an iteration's results depend on.
ITERATION_STEPS = ("start", "rollout", "score", "update", "league")

#: What only schedules the steps (the loop's reads, and how many checkpoints the update keeps):
#: a run lengthened or checkpointed more often resumes instead of starting again.
SCHEDULE = ("train.iterations", "train.checkpoint_every", "train.eval_every", "train.keep_checkpoints",
            "train.drift_invalid_rise", "train.drift_kl")
#: What sets speed and memory, not what the policy learns: a run that runs out of memory goes on
#: with smaller micro-batches, another device or an engine of another size. (Summation order
#: can differ in the last bits: such a run is the same run, not a bitwise repeat.)
PERFORMANCE = ("engine.hf", "engine.vllm", "engine.concurrency", "train.batching", "train.micro_batch_tokens",
               "train.micro_batch_rows", "train.share_prefix", "train.logits_chunk_tokens", "train.gradient_checkpointing",
               "train.deterministic", "model.device", "train.write_behind",
               # how many workers share the update and how they hold the model: the same mini-batches
               "train.workers", "train.worker_gpus", "train.worker_cpus", "train.sharding")


def identity_keys(settings: Settings) -> tuple[list[str], list[str]]:
    """The keys of :func:`run_identity` and the sub-keys it leaves out."""
    read = {key for step in ITERATION_STEPS for key in READS[step] if not key.startswith(("paths.", "run."))}
    keys = sorted(k for k in read if not any(k.startswith(other + ".") for other in read))  # a section covers its keys
    ignore = [*SCHEDULE, *PERFORMANCE, "model.local_dir", "algo.name"]
    if settings.train.lr_schedule == "linear":  # the rate of every iteration depends on how many there are
        ignore.remove("train.iterations")
    if settings.model.build == "tiny":  # a preset is named by its settings; its path is only where it lies
        ignore.append("model.path")
    return keys, ignore


def run_identity(settings: Settings) -> dict[str, Any]:
    """The settings a run's iterations depend on: what the steps of an iteration read, less
    where files go (``paths``, the run's name, where the base model lies), the schedule and
    what only sets speed and memory. A run resumes only under the same identity (``run.json``)."""
    return settings.values_of(*identity_keys(settings))


def identity_hash(settings: Settings) -> str:
    """A short hash of :func:`run_identity` (what checkpoint manifests record)."""
    return settings.hash_of(*identity_keys(settings))
