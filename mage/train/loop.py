"""The training loop: rollout -> returns -> advantages -> update -> checkpoint.

Each step is a plain function, so the Prefect tasks of ``tasks/`` run exactly these steps
one by one (with file references between them) and :func:`train` runs them in-process.
A :class:`TrainingState` holds the policy, its trainer and the checkpoint whose weights
and optimizer state it equals; every finished iteration leaves a checkpoint and its
trajectory table, so an interrupted run resumes from the last complete checkpoint with
the same optimizer and RNG state and loses no finished iteration.

Layout of a run (``paths.runs/<run.name>``)::

    checkpoints/ckpt-00001/ ...      one per finished iteration (train.checkpoint_every)
    rollouts/iteration-00001.parquet trajectory table with returns and advantages
    metrics.jsonl                    one line of metrics per finished iteration
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import torch

from mage import io
from mage.algo import add_advantages, add_returns
from mage.backends import Backend, make_backend
from mage.models.policy import Policy, ensure_model, load_policy
from mage.rollout import MetaEpisodeSpec, RolloutEngine, RolloutStats, plan_meta_episodes, write_trajectories
from mage.rollout.engine import derive_seed
from mage.rollout.metrics import final_episode_metrics
from mage.settings import Settings
from mage.train import checkpoint as ckpt
from mage.train.config import TrainConfig
from mage.train.trainer import PolicyTrainer


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    def rollout(self, iteration: int) -> Path:
        return self.rollouts / f"iteration-{iteration:05d}.parquet"

    def rollout_shard(self, iteration: int, shard: int) -> Path:
        return self.rollouts / "shards" / f"iteration-{iteration:05d}-shard-{shard:03d}.parquet"

    @classmethod
    def of(cls, settings: Settings) -> RunPaths:
        return cls(Path(settings.paths.runs) / settings.run_name)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One writer per run: hold the run's lock (beside the run directory, so nothing
        versions it), then clear what a killed writer left behind (temporary checkpoint
        directories and files). A second writer stops at once with the holder's pid."""
        with io.exclusive_lock(self.root.parent / f".{self.root.name}.lock", f"run {self.root.name!r}"):
            for path in io.remove_stale_temporaries(self.root):
                logging.getLogger(__name__).warning(f"removed {path}: left by an interrupted write")
            yield


# -- the model ---------------------------------------------------------------------------
def load_run_policy(settings: Settings, checkpoint: ckpt.Checkpoint | None = None, trainable: bool = True) -> Policy:
    """The policy of a run: the base model plus LoRA, with a checkpoint's weights if given."""
    model = settings.model
    source = ensure_model(settings)
    policy = load_policy(source, dtype=model.dtype, device=model.device, lora=model.lora, trainable=trainable)
    if checkpoint is not None:
        ckpt.load_weights(policy, checkpoint)
    return policy


def rollout_backend(settings: Settings, policy: Policy | None = None, checkpoint: ckpt.Checkpoint | None = None) -> Backend:
    """A backend generating with the run's policy (``policy`` in memory, else ``checkpoint``)."""
    engine, model = settings.engine, settings.model
    options = dict(engine.backend_options)
    if engine.backend == "hf":
        if policy is None:
            policy = load_run_policy(settings, checkpoint, trainable=False)
        return make_backend("hf", model=policy.model, tokenizer=policy.tokenizer, chat=model.chat,
                            enable_thinking=model.enable_thinking, **options)
    if engine.backend == "vllm":
        # The process's engine (started once, on the base model): the checkpoint is the policy it serves.
        kind = checkpoint.kind if checkpoint is not None else None
        return make_backend("vllm", model=ensure_model(settings), dtype=model.dtype, chat=model.chat,
                            adapter=checkpoint.path if kind == "lora" else None,
                            weights=checkpoint.path if kind == "full" else None,
                            lora_rank=model.lora.r if model.lora is not None else None,
                            enable_thinking=model.enable_thinking, seed=settings.seed, **options)
    return make_backend("scripted", **options)


# -- one iteration, step by step ------------------------------------------------------------
def plan_iteration(settings: Settings, iteration: int) -> list[MetaEpisodeSpec]:
    """The meta-episodes of an iteration: groups drawn from the training population."""
    entries = [e for e in settings.population.entries if e.split == "train"]
    seat_split, num_seats = settings.population.seat_split, settings.game.num_players
    engine = settings.engine
    return plan_meta_episodes(
        entries, engine.groups, engine.rollout.group_size, derive_seed(settings.seed, iteration), seat_split, num_seats,
        mixed=settings.algo.grouping == "mixed",
    )


def shard_specs(specs: Sequence[MetaEpisodeSpec], shard: int, shards: int) -> list[MetaEpisodeSpec]:
    """Shard ``shard`` of ``shards``: whole groups, dealt round-robin (groups stay together
    so a shard's rows can be scored with the others' after they are concatenated)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be in [0, {shards}), got {shard}")
    return [s for s in specs if s.group_id % shards == shard]


def rollout_iteration(
    settings: Settings, backend: Backend, iteration: int, progress: bool = True, shard: int = 0, shards: int = 1
) -> tuple[pl.DataFrame, RolloutStats]:
    """Play this iteration's meta-episodes (or one shard of them) against the training population."""
    specs = shard_specs(plan_iteration(settings, iteration), shard, shards)
    engine = RolloutEngine(backend, settings.engine.rollout, settings.game.params)
    # One sampling seed per (iteration, shard): a re-run draws the same replies.
    sampling = replace(settings.engine.sampling, seed=derive_seed(settings.seed, iteration, shard))
    table = engine.run(specs, sampling, run_id=settings.run_name, iteration=iteration, progress=progress)
    return table, engine.last_stats


def score_iteration(settings: Settings, table: pl.DataFrame) -> pl.DataFrame:
    """Returns and advantages (pure functions of the table)."""
    return add_advantages(add_returns(table, settings.algo), settings.algo)


def summarise(table: pl.DataFrame) -> dict[str, float]:
    """Per-iteration training metrics from the scored table (first and final episode per opponent)."""
    out: dict[str, float] = {}
    for row in final_episode_metrics(table).iter_rows(named=True):
        for name in ("first_win_rate", "final_win_rate", "first_mean_return", "final_mean_return", "return_gain"):
            out[f"rollout/{row['opponent']}/{name}"] = float(row[name])
    play = table.filter(pl.col("phase") == "play")
    out["rollout/invalid_rate"] = float(1 - play["valid"].cast(pl.Float64).mean())
    out["rollout/calls"] = float(table.height)
    out["rollout/episodes"] = float(play.select("meta_id", "episode").unique().height)
    out["rollout/mean_response_tokens"] = float(table["response_token_ids"].list.len().mean())
    return out


def rollout_metrics_of(stats: Sequence[RolloutStats]) -> dict[str, float]:
    """Throughput of an iteration's rollout (shards run side by side: the slowest sets the time)."""
    seconds = max((s.total_seconds for s in stats), default=0.0)
    metas = sum(s.meta_episodes for s in stats)
    tokens = sum(s.generated_tokens for s in stats)
    return {
        "rollout/seconds": seconds,
        "rollout/meta_episodes_per_second": metas / seconds if seconds else 0.0,
        "rollout/generated_tokens_per_second": tokens / seconds if seconds else 0.0,
    }


@dataclass
class TrainingState:
    """The policy and its trainer, equal to ``checkpoint`` (None: the base weights, fresh optimizer)."""

    settings: Settings
    policy: Policy
    trainer: PolicyTrainer
    checkpoint: ckpt.Checkpoint | None = None
    _backend: Backend | None = field(default=None, repr=False)

    @property
    def checkpoint_hash(self) -> str | None:
        return None if self.checkpoint is None else ckpt.content_hash(self.checkpoint.path)

    def backend(self) -> Backend:
        """The rollout backend of the current weights (hf shares the policy's model in memory)."""
        if self._backend is None:
            self._backend = rollout_backend(self.settings, self.policy, self.checkpoint)
        return self._backend

    def update(self, table: pl.DataFrame, iteration: int) -> dict[str, float]:
        """One PPO update on a scored table; the seed and the learning rate follow the
        iteration, so a resumed run replays the same update."""
        if self._backend is not None:
            self._backend.sleep()  # vLLM's sleep mode: the trainer gets the GPU memory
        try:
            return self.trainer.update(table, seed=derive_seed(self.settings.seed, iteration, 1),
                                       learning_rate=self.settings.train.learning_rate_at(iteration))
        finally:
            if self._backend is not None:
                self._backend.wake_up()

    def save(self, iteration: int, metrics: dict[str, Any]) -> ckpt.Checkpoint:
        """Checkpoint the current weights, optimizer and RNG state as iteration ``iteration``."""
        paths = RunPaths.of(self.settings)
        saved = ckpt.save_checkpoint(
            paths.checkpoints, iteration, self.policy, self.trainer.optimizer,
            config_hash=self.settings.section_hash(), parent=str(self.checkpoint.path) if self.checkpoint else None,
            metrics=metrics,
        )
        ckpt.prune_checkpoints(paths.checkpoints, self.settings.train.keep_checkpoints)
        self.checkpoint = saved
        if self._backend is not None:  # the rollouts go on with the new policy
            self._backend.load_checkpoint(saved.path, saved.kind)
        return saved


def start_training(settings: Settings, checkpoint: ckpt.Checkpoint | None = None) -> TrainingState:
    """A training state at ``checkpoint`` (weights, optimizer and RNG state), or at the start."""
    if settings.train.deterministic:
        from transformers.trainer_utils import enable_full_determinism

        enable_full_determinism(settings.train.seed)
    # A fresh LoRA adapter is drawn from torch's global generator: seed it, so a run's
    # starting point depends on its seed alone, not on what the process ran before.
    torch.manual_seed(settings.train.seed)
    # The trainer is built on the base weights (full fine-tuning copies them as the
    # reference policy); a checkpoint's weights are loaded into the policy afterwards.
    policy = load_run_policy(settings)
    trainer = PolicyTrainer(policy, settings.train, settings.algo, temperature=settings.engine.sampling.temperature)
    if checkpoint is not None:
        ckpt.load_weights(policy, checkpoint)
        ckpt.load_trainer_state(checkpoint, trainer.optimizer)
    return TrainingState(settings, policy, trainer, checkpoint)


def checkpoint_due(settings: Settings, iteration: int) -> bool:
    return iteration % settings.train.checkpoint_every == 0 or iteration == settings.train.iterations


#: A damaged metrics.jsonl: every iteration's metrics are in it, and no one step rewrites them.
METRICS_REMEDY = "fix or delete that line (the other iterations' metrics are kept), or restore the file with `dvc pull`"


def record_metrics(settings: Settings, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Append an iteration's metrics to the run's ``metrics.jsonl`` (replacing an older line
    of the same iteration); every recorded iteration's metrics, this one included."""
    path = RunPaths.of(settings).metrics
    kept = [m for m in io.read_json_lines(path, METRICS_REMEDY) if m.get("iteration") != metrics["iteration"]]
    # Rewriting the whole file atomically keeps it whole after a crash.
    io.write_text(path, "".join(json.dumps(m, sort_keys=True) + "\n" for m in [*kept, metrics]))
    return [*kept, metrics]


def drift_warning(train_cfg: TrainConfig, metrics: dict[str, Any], first: dict[str, Any]) -> str | None:
    """A warning when the policy drifts far from its reference: the invalid-reply rate rose
    ``train.drift_invalid_rise`` over the run's ``first`` iteration, or the KL exceeds
    ``train.drift_kl``. None otherwise."""
    invalid, first_invalid = (m.get("rollout/invalid_rate", 0.0) for m in (metrics, first))
    kl = metrics.get("train/kl", 0.0)
    if invalid <= first_invalid + train_cfg.drift_invalid_rise and kl <= train_cfg.drift_kl:
        return None
    return (f"iteration {metrics['iteration']}: invalid rate {invalid:.2f} (first iteration {first_invalid:.2f}), "
            f"KL {kl:.2f}: the policy is drifting far from its reference (a lower train.learning_rate or a "
            "larger algo.kl_coef usually holds it)")


def record_iteration(settings: Settings, metrics: dict[str, Any]) -> str | None:
    """Record an iteration's metrics (``metrics.jsonl``) and return its drift warning against
    the run's first recorded iteration, also after a resume (None: no drift). The library's
    loop and the ``train`` flow both end an iteration with this."""
    recorded = record_metrics(settings, metrics)
    first = min(recorded, key=lambda m: m.get("iteration", 0))
    return drift_warning(settings.train, metrics, first)


@dataclass
class IterationResult:
    iteration: int
    metrics: dict[str, Any]
    checkpoint: ckpt.Checkpoint | None
    rollout_path: Path
    drift_warning: str | None = None


def iteration_metrics(iteration: int, table: pl.DataFrame, update: dict[str, float]) -> dict[str, Any]:
    """An iteration's metrics: the scored table's (per opponent) and the update's (``train/``)."""
    return {"iteration": iteration, **summarise(table), **{f"train/{k}": v for k, v in update.items()}}


def run_iteration(state: TrainingState, iteration: int, progress: bool = True) -> IterationResult:
    """Rollout, returns and advantages, update, trajectory table and (when due) checkpoint."""
    settings = state.settings
    raw, stats = rollout_iteration(settings, state.backend(), iteration, progress)
    table = score_iteration(settings, raw)
    update = state.update(table, iteration)
    metrics = iteration_metrics(iteration, table, update) | rollout_metrics_of([stats])
    rollout_path = write_trajectories(table, RunPaths.of(settings).rollout(iteration))
    saved = state.save(iteration, metrics) if checkpoint_due(settings, iteration) else None
    return IterationResult(iteration, metrics, saved, rollout_path, record_iteration(settings, metrics))


def train(
    settings: Settings,
    *,
    resume: bool = True,
    progress: bool = True,
    on_iteration: Callable[[IterationResult], None] | None = None,
    stop_after: int | None = None,
) -> list[IterationResult]:
    """Run (or resume) the training loop in-process; see the module docstring.

    ``stop_after`` ends the call after that many iterations of this call (the run
    itself is not shortened: a later call resumes it).
    """
    paths = RunPaths.of(settings)
    with paths.writing():
        latest = ckpt.latest_checkpoint(paths.checkpoints) if resume else None
        state = start_training(settings, latest)
        start = latest.iteration + 1 if latest else 1
        results = []
        for iteration in range(start, settings.train.iterations + 1):
            if stop_after is not None and len(results) >= stop_after:
                break
            result = run_iteration(state, iteration, progress)
            results.append(result)
            if result.drift_warning:
                logging.getLogger(__name__).warning(result.drift_warning)
            if on_iteration is not None:
                on_iteration(result)
    return results
