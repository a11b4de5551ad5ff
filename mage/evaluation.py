"""Evaluation: a policy against an opponent set, per opponent and per episode k.

An evaluation plays ``meta_episodes`` per split, shared equally by the split's opponents in
whole groups (half seated second, where the game has two seats), so the pooled rate of a
split has a known precision (384 meta-episodes: a 95% half-width of at most 0.05) whatever
the number of opponents. Initial states are drawn from the evaluation seed only, so two
checkpoints are evaluated on the same deals, boards and levels (a paired comparison). Sampling uses the evaluation settings
(MAGE-SPEC section 5: temperature 0.7, top-p 0.8, top-k 20) and may play more episodes
than training (``episodes``). The result is an ordinary trajectory table; metrics come
from ``mage.rollout.metrics``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import polars as pl

from mage.backends import Backend
from mage.population import PopulationEntry
from mage.rollout import RolloutConfig, RolloutEngine, plan_meta_episodes
from mage.rollout.engine import derive_seed
from mage.sections import EvalConfig

if TYPE_CHECKING:
    from mage.settings import Settings
    from mage.train.checkpoint import Checkpoint


def opponents_for(settings: Settings, split: str) -> list[PopulationEntry]:
    entries = settings.population.entries
    return list(entries) if split == "all" else [e for e in entries if e.split == split]


def evaluate(
    settings: Settings,
    backend: Backend,
    cfg: EvalConfig,
    entries: list[PopulationEntry] | None = None,
    run_id: str = "eval",
    iteration: int = 0,
    progress: bool = True,
    rollout: RolloutConfig | None = None,
) -> pl.DataFrame:
    """Play every opponent of ``entries`` (default: ``cfg.split``) and return the table;
    meta-episodes are played as ``rollout`` (default: ``engine``'s settings) with the
    evaluation's episodes, group size and early stop."""
    entries = entries if entries is not None else opponents_for(settings, cfg.split)
    seat_split, num_seats = settings.population.seat_split, settings.game.num_players
    groups = cfg.groups_per_opponent(len(entries))
    specs = []
    for index, entry in enumerate(entries):
        planned = plan_meta_episodes(
            [entry], groups, cfg.group_size, derive_seed(cfg.seed, zlib.crc32(entry.id.encode())), seat_split, num_seats
        )  # an opponent's initial states depend on its id, not on what else is evaluated
        offset_meta, offset_group = len(specs), index * groups
        specs += [replace(s, meta_id=s.meta_id + offset_meta, group_id=s.group_id + offset_group) for s in planned]
    rollout = replace(rollout or settings.engine.rollout, episodes=cfg.episodes, group_size=cfg.group_size,
                      early_stop=cfg.early_stop)
    engine = RolloutEngine(backend, rollout, settings.game.params)
    sampling = replace(cfg.sampling, seed=derive_seed(cfg.seed, 99))
    return engine.run(specs, sampling, run_id=run_id, iteration=iteration, progress=progress)


def evaluate_checkpoint(
    settings: Settings,
    checkpoint: Checkpoint | None = None,
    splits: Sequence[str] = ("train", "held_out"),
    cfg: EvalConfig | None = None,
    progress: bool = False,
) -> dict[str, pl.DataFrame]:
    """Play ``checkpoint`` (None: the run's starting weights) against each split's opponents
    with ``cfg`` (default: ``settings.eval``; its ``split`` is each of ``splits``): one table
    per split. The policy is loaded once for all splits and its backend released after."""
    # the trainer's module (torch, peft) is loaded only when a policy is actually played
    from mage.train.loop import rollout_backend

    cfg = cfg if cfg is not None else settings.eval
    backend = rollout_backend(settings, checkpoint=checkpoint)
    try:
        iteration = checkpoint.iteration if checkpoint is not None else 0
        return {split: evaluate(settings, backend, replace(cfg, split=split), run_id=settings.run_name,
                                iteration=iteration, progress=progress) for split in splits}
    finally:
        backend.release()  # vllm: the process's engine stays for the next evaluation
