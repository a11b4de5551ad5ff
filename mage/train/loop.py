"""The training loop: rollout -> returns -> advantages -> update -> checkpoint.

Each step is a plain function so the Prefect tasks can run them one by one (with file
references between them); :func:`train` runs them in-process, keeping the policy in
memory. Every finished iteration leaves a checkpoint and its trajectory table, so an
interrupted run resumes from the last complete checkpoint with the same optimizer and
RNG state and loses no finished iteration.

Layout of a run (``paths.runs/<run.name>``)::

    checkpoints/ckpt-00001/ ...      one per finished iteration
    rollouts/iteration-00001.parquet trajectory table with returns and advantages
    metrics.jsonl                    one line of metrics per finished iteration
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mage import io
from mage.algo import add_advantages, add_returns
from mage.backends import Backend, make_backend
from mage.models.policy import Policy, load_policy
from mage.population import PopulationEntry, population_entries
from mage.rollout import RolloutEngine, plan_meta_episodes, write_trajectories
from mage.rollout.metrics import final_episode_metrics
from mage.rollout.engine import derive_seed
from mage.settings import Settings
from mage.train import checkpoint as ckpt
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

    @classmethod
    def of(cls, settings: Settings) -> RunPaths:
        return cls(Path(settings.paths.get("runs", "artifacts/runs")) / settings.run_name)


def ensure_model(settings: Settings, progress: bool = True) -> str:
    """The base model's location; the tiny preset is built first if it is missing."""
    model = settings.model
    if model.build == "tiny" and not (Path(model.path) / "config.json").is_file():
        from mage.models.build import build_tiny

        build_tiny(model, progress=progress)
    return model.path


def load_run_policy(settings: Settings, checkpoint: ckpt.Checkpoint | None = None, trainable: bool = True) -> Policy:
    """The policy of a run: the base model plus LoRA, with a checkpoint's weights if given."""
    model = settings.model
    source = ensure_model(settings)
    policy = load_policy(source, dtype=model.dtype, device=model.device, lora=model.lora, trainable=trainable)
    if checkpoint is not None:
        ckpt.load_weights(policy, checkpoint)
    return policy


def rollout_backend(settings: Settings, policy: Policy | None = None, checkpoint: ckpt.Checkpoint | None = None) -> Backend:
    """A backend generating with the run's current policy."""
    engine, model = settings.engine, settings.model
    options = dict(engine.backend_options)
    if engine.backend == "hf":
        if policy is None:
            policy = load_run_policy(settings, checkpoint, trainable=False)
        return make_backend("hf", model=policy.model, tokenizer=policy.tokenizer, chat=model.chat,
                            enable_thinking=model.enable_thinking, **options)
    if engine.backend == "vllm":
        if checkpoint is not None and checkpoint.kind == "full":
            source, adapter = str(checkpoint.path), None
        else:
            source, adapter = ensure_model(settings), (checkpoint.path if checkpoint is not None else None)
        return make_backend("vllm", model=source, adapter=adapter, dtype=model.dtype, chat=model.chat,
                            enable_thinking=model.enable_thinking, seed=settings.seed, **options)
    return make_backend("scripted", **options)


def training_entries(settings: Settings) -> tuple[list[PopulationEntry], float]:
    from mage.config import compose  # noqa: F401  (settings carry the composed tree)

    entries = population_entries(settings.raw)
    return [e for e in entries if e.split == "train"], float(settings.raw["population"].get("seat_split", 0.5))


def rollout_iteration(settings: Settings, backend: Backend, iteration: int, progress: bool = True) -> pl.DataFrame:
    """Play this iteration's meta-episodes against the training population."""
    entries, seat_split = training_entries(settings)
    engine_cfg = settings.engine
    seed = derive_seed(settings.seed, iteration)
    num_seats = 1 if settings.game["name"] == "sokoban" else 2
    specs = plan_meta_episodes(entries, engine_cfg.groups, engine_cfg.rollout.group_size, seed, seat_split, num_seats)
    engine = RolloutEngine(backend, engine_cfg.rollout, settings.game.get("params") or {})
    sampling = engine_cfg.sampling.__class__(**{**engine_cfg.sampling.__dict__, "seed": seed})
    return engine.run(specs, sampling, run_id=settings.run_name, iteration=iteration, progress=progress)


def score_iteration(settings: Settings, table: pl.DataFrame) -> pl.DataFrame:
    """Returns and advantages (pure functions of the table)."""
    return add_advantages(add_returns(table, settings.algo), settings.algo)


def summarise(table: pl.DataFrame) -> dict[str, float]:
    """Per-iteration training metrics from the scored table (final episode per opponent)."""
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


@dataclass
class IterationResult:
    iteration: int
    metrics: dict[str, Any]
    checkpoint: ckpt.Checkpoint | None
    rollout_path: Path


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
    latest = ckpt.latest_checkpoint(paths.checkpoints) if resume else None
    # The trainer is built on the base weights (full fine-tuning copies them as the
    # reference policy); a resumed run's weights are loaded into the policy afterwards.
    policy = load_run_policy(settings)
    trainer = PolicyTrainer(policy, settings.train, settings.algo)
    if latest is not None:
        ckpt.load_weights(policy, latest)
        ckpt.load_trainer_state(latest, trainer.optimizer)
    start = latest.iteration + 1 if latest else 1
    backend = rollout_backend(settings, policy, latest)
    config_hash = settings.section_hash()
    parent = str(latest.path) if latest else None
    results = []
    for iteration in range(start, settings.train.iterations + 1):
        if stop_after is not None and len(results) >= stop_after:
            break
        table = score_iteration(settings, rollout_iteration(settings, backend, iteration, progress))
        update = trainer.update(table, seed=derive_seed(settings.seed, iteration, 1))
        metrics = {"iteration": iteration, **summarise(table), **{f"train/{k}": v for k, v in update.items()}}
        metrics["rollout/seconds"] = getattr(backend, "last_seconds", None) or 0.0
        rollout_path = write_trajectories(table, paths.rollout(iteration))
        saved = None
        if iteration % settings.train.checkpoint_every == 0 or iteration == settings.train.iterations:
            saved = ckpt.save_checkpoint(
                paths.checkpoints, iteration, policy, trainer.optimizer,
                config_hash=config_hash, parent=parent, metrics=metrics,
            )
            parent = str(saved.path)
            ckpt.prune_checkpoints(paths.checkpoints, settings.train.keep_checkpoints)
            if settings.engine.backend == "vllm":  # serve the new weights
                backend.set_adapter(saved.path)  # type: ignore[attr-defined]
        _append_metrics(paths.metrics, metrics)
        result = IterationResult(iteration, metrics, saved, rollout_path)
        results.append(result)
        if on_iteration is not None:
            on_iteration(result)
    return results


def _append_metrics(path: Path, metrics: dict[str, Any]) -> None:
    """Append a line; rewriting the whole file atomically keeps it whole after a crash."""
    lines = path.read_text().splitlines() if path.is_file() else []
    iteration = metrics["iteration"]
    lines = [line for line in lines if json.loads(line).get("iteration") != iteration]
    io.write_text(path, "\n".join(lines + [json.dumps(metrics, sort_keys=True)]) + "\n")
