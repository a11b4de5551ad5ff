"""What an iteration leaves besides its weights: its metrics, its performance, the drift
warning, and dvclive's metrics and plots.

* ``metrics.jsonl`` holds what the iteration computed (per-opponent win rates and returns,
  the update's loss, KL, entropy, ...): a run, resumed or not, run by the library's loop or
  by the flow, writes it byte for byte the same.
* ``performance.jsonl`` holds how fast it went and how much memory it took, which depend on
  the machine: apart, so that the first file repeats.
* dvclive (``paths.live``) shows both, one step per iteration, rebuilt from the two files when
  a run resumes, so its plots hold every iteration exactly once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from mage import io
from mage.config.sections import TrainSection
from mage.rollout import RolloutStats
from mage.rollout.metrics import final_episode_metrics
from mage.run.layout import RunLayout

logger = logging.getLogger(__name__)

#: A damaged metrics file: every iteration's line is in it, and no one step rewrites them.
METRICS_REMEDY = "fix or delete that line (the other iterations' lines are kept), or restore the file with `dvc pull`"
#: The update's figures that describe the machine, not the iteration (they go to performance.jsonl).
UPDATE_PERFORMANCE = ("seconds", "tokens_per_second", "peak_memory_mib")


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


def iteration_records(iteration: int, table: pl.DataFrame, update: Mapping[str, float],
                      stats: Sequence[RolloutStats]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An iteration's two records: its metrics (the scored table's, per opponent, and the
    update's, ``train/``) and its performance (the rollout's throughput, the update's time
    and memory)."""
    metrics = {"iteration": iteration, **summarise(table),
               **{f"train/{k}": v for k, v in update.items() if k not in UPDATE_PERFORMANCE}}
    opponent_calls = sum(s.opponent_calls for s in stats)
    if opponent_calls:  # league snapshots played: their invalid replies became random legal moves
        metrics["rollout/opponent_invalid_rate"] = sum(s.opponent_invalid for s in stats) / opponent_calls
    seconds = max((s.total_seconds for s in stats), default=0.0)  # shards run side by side: the slowest
    metas, tokens = sum(s.meta_episodes for s in stats), sum(s.generated_tokens for s in stats)
    performance = {
        "iteration": iteration,
        "rollout/seconds": seconds,
        "rollout/meta_episodes_per_second": metas / seconds if seconds else 0.0,
        "rollout/generated_tokens_per_second": tokens / seconds if seconds else 0.0,
        **{f"train/{k}": update[k] for k in UPDATE_PERFORMANCE if k in update},
    }
    return metrics, performance


def append_record(path: Path, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add an iteration's record to a JSON-lines file (replacing an older line of the same
    iteration); every recorded iteration's record, this one included, by iteration."""
    kept = [r for r in io.read_json_lines(path, METRICS_REMEDY) if r.get("iteration") != record["iteration"]]
    records = sorted([*kept, dict(record)], key=lambda r: r.get("iteration", 0))
    # Rewriting the whole file atomically keeps it whole after a crash.
    io.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return records


def keep_up_to(layout: RunLayout, iteration: int) -> list[dict[str, Any]]:
    """Drop the metrics, performance and league records of iterations after ``iteration`` (what a stopped run
    recorded past its newest checkpoint, computed again from there); the records kept."""
    for path in (layout.metrics, layout.performance, layout.league):
        records = io.read_json_lines(path, METRICS_REMEDY)
        kept = [r for r in records if r.get("iteration", 0) <= iteration]
        if len(kept) < len(records):
            io.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return history(layout)


def drift_warning(train_cfg: TrainSection, metrics: Mapping[str, Any], first: Mapping[str, Any]) -> str | None:
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


def history(layout: RunLayout) -> list[dict[str, Any]]:
    """Every recorded iteration's metrics and performance, one dict each, by iteration."""
    performance = {r.get("iteration"): r for r in io.read_json_lines(layout.performance, METRICS_REMEDY)}
    return [performance.get(m.get("iteration"), {}) | m for m in io.read_json_lines(layout.metrics, METRICS_REMEDY)]


@contextlib.contextmanager
def _streams_kept() -> Iterator[None]:
    """Put ``sys.stdout`` and ``sys.stderr`` back after: dvclive starts DVC's logging, which
    replaces them with colorama's wrappers, for good, in whatever process the library runs
    (a notebook's, a test's)."""
    out, err = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


class LiveMetrics:
    """dvclive's metrics and plots of a run (``paths.live``): every recorded iteration at
    start (a resumed run's plots hold each iteration once), then one step per iteration."""

    def __init__(self, directory: str, recorded: Sequence[Mapping[str, Any]]) -> None:
        with _streams_kept():
            from dvclive import Live

            # The DVC pipeline declares these metrics and plots itself: no dvc.yaml edits, no extra experiments.
            self.live = Live(dir=directory, resume=False, save_dvc_exp=False, dvcyaml=None, report=None)
        for record in recorded:
            self.log(record)

    def log(self, record: Mapping[str, Any]) -> None:
        with _streams_kept():
            self.live.step = int(record["iteration"])
            for key, value in sorted(record.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
                    self.live.log_metric(key, value)
            self.live.next_step()

    def close(self) -> None:
        with _streams_kept():
            self.live.end()
