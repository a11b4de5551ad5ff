"""The generalisation report of a checkpoint (MAGE-SPEC section 7).

Input: evaluation trajectory tables (one per opponent split) and the population manifest.
Output, per opponent and per episode k:

* ``win_rate``, ``draw_rate``, ``mean_return`` over the meta-episodes that played k, and
  ``pass_at_k`` (won within the first k episodes) over all of them;
* the ceilings of what was actually played: ``max_win_probability`` (what a player who sees
  everything wins) and ``best_response_return`` (OpenSpiel's best response, scaled), each
  averaged over the evaluated meta-episodes. Where the manifest has the exact win ceiling
  of every initial state (opponents with an explicit policy), a meta-episode counts with
  the ceiling of its own deal and seat: sixteen deals are not the average deal. Otherwise
  (Monte-Carlo ceilings, Sokoban) the seat's ceiling is used;
* ``pass_at_k_vs_ceiling`` = pass@k / max win probability and ``return_vs_ceiling`` =
  mean return / best-response return (null where that ceiling is below
  ``MIN_RETURN_CEILING``: a ratio to a loss, to zero or to nearly zero says nothing; against
  an equilibrium opponent a best response earns only the game's value, 0 over both Kuhn
  seats);
* ``invalid_rate`` of the play calls.

Per opponent, the exploration-exploitation gain: final (last played) episode against the
first, in win rate and mean return. Everything here is a pure function of the tables and
the manifest, so the report's numbers can be recomputed from the trajectory table alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from mage import io
from mage.rollout.metrics import ALL, final_episode_metrics, rollout_metrics

CEILINGS = ("max_win_probability", "best_response_return")


def seat_ceilings(manifest: Mapping[str, Any]) -> pl.DataFrame:
    """One row per (opponent, seat) with its ceilings (Sokoban: one seat, 0)."""
    rows = []
    for opponent in manifest["opponents"]:
        for seat_key, figures in opponent["ceilings"].items():
            if not seat_key.startswith("seat_"):
                continue
            rows.append({
                "opponent": opponent["id"],
                "split": opponent["split"],
                "seat": int(seat_key.removeprefix("seat_")),
                **{name: float(figures[name]["value"]) for name in CEILINGS},
                "ceiling_method": figures["max_win_probability"]["method"],
            })
    return pl.DataFrame(rows)


def initial_state_win_ceilings(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """Per evaluated meta-episode, the exact win ceiling of its own initial state, where the
    manifest has it (columns run_id, iteration, meta_id, state_win_ceiling)."""
    from mage.ceilings import state_key
    from mage.games import InitialState, make_game

    per_state = {
        (o["id"], int(seat.removeprefix("seat_"))): figures["max_win_probability"].get("per_initial_state")
        for o in manifest["opponents"] for seat, figures in o["ceilings"].items() if seat.startswith("seat_")
    }
    games: dict[str, Any] = {}
    rows = []
    metas = table.select("run_id", "iteration", "meta_id", "opponent", "seat", "initial_state").unique(
        subset=["run_id", "iteration", "meta_id"], keep="first"
    )
    for meta in metas.iter_rows(named=True):
        values = per_state.get((meta["opponent"], meta["seat"]))
        value = None
        if values:
            initial = InitialState.from_json(meta["initial_state"])
            game = games.setdefault(initial.game, make_game(initial.game))
            state = game.openspiel_state(initial)
            value = values.get(state_key(state)) if state is not None else None
        rows.append({"run_id": meta["run_id"], "iteration": meta["iteration"], "meta_id": meta["meta_id"],
                     "state_win_ceiling": value})
    schema = {"run_id": pl.String, "iteration": pl.Int64, "meta_id": pl.Int64, "state_win_ceiling": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def _played_ceilings(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """Ceilings per opponent averaged over its evaluated meta-episodes (per initial state where known)."""
    metas = table.select("run_id", "iteration", "meta_id", "opponent", "seat").unique()
    joined = metas.join(seat_ceilings(manifest), on=["opponent", "seat"], how="left")
    missing = joined.filter(pl.col("max_win_probability").is_null())["opponent"].unique().to_list()
    if missing:
        raise ValueError(f"the population manifest has no ceilings for opponent(s) {missing}")
    exact = initial_state_win_ceilings(table, manifest)
    joined = joined.join(exact, on=["run_id", "iteration", "meta_id"], how="left").with_columns(
        pl.col("state_win_ceiling").is_not_null().all().over("opponent").alias("_per_state"),
    ).with_columns(
        pl.when(pl.col("_per_state")).then(pl.col("state_win_ceiling")).otherwise(pl.col("max_win_probability"))
        .alias("max_win_probability"),
        pl.when(pl.col("_per_state")).then(pl.lit("exact, per initial state")).otherwise(pl.col("ceiling_method"))
        .alias("ceiling_method"),
    )
    per_opponent = joined.group_by("opponent").agg(
        pl.col("split").first(), pl.col("ceiling_method").first(), *[pl.col(c).mean() for c in CEILINGS]
    )
    pooled = joined.select(
        pl.lit(ALL).alias("opponent"), pl.lit("mixed").alias("split"), pl.lit("mixed").alias("ceiling_method"),
        *[pl.col(c).mean() for c in CEILINGS],
    )
    return pl.concat([per_opponent, pooled])


MIN_RETURN_CEILING = 0.1  # return units (episode returns are +-5..10): below it a ratio only amplifies noise


def _ratio(value: str, ceiling: str, floor: float = 1e-9) -> pl.Expr:
    return pl.when(pl.col(ceiling) >= floor).then(pl.col(value) / pl.col(ceiling)).otherwise(None)


def per_episode(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """Per opponent (and ``all``) and episode k: outcomes, pass@k, ceilings and ratios."""
    ceilings = _played_ceilings(table, manifest)
    return (
        rollout_metrics(table)
        .join(ceilings, on="opponent", how="left")
        .with_columns(
            _ratio("pass_at_k", "max_win_probability").alias("pass_at_k_vs_ceiling"),
            _ratio("mean_return", "best_response_return", MIN_RETURN_CEILING).alias("return_vs_ceiling"),
        )
        .sort(pl.col("opponent") == ALL, "split", "opponent", "episode")
    )


def per_opponent(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """Per opponent: first vs final episode (the exploration-exploitation gain), ceilings, invalid rate."""
    ceilings = _played_ceilings(table, manifest)
    play = table.filter(pl.col("phase") == "play")
    invalid = pl.concat([
        play.group_by("opponent").agg((1.0 - pl.col("valid").cast(pl.Float64).mean()).alias("invalid_rate")),
        play.select(pl.lit(ALL).alias("opponent"), (1.0 - pl.col("valid").cast(pl.Float64).mean()).alias("invalid_rate")),
    ])
    return (
        final_episode_metrics(table)
        .join(ceilings, on="opponent", how="left")
        .join(invalid, on="opponent", how="left")
        .with_columns(
            _ratio("final_win_rate", "max_win_probability").alias("final_win_vs_ceiling"),
            _ratio("final_mean_return", "best_response_return", MIN_RETURN_CEILING).alias("final_return_vs_ceiling"),
        )
        .sort(pl.col("opponent") == ALL, "split", "opponent")
    )


def build_report(tables: Mapping[str, pl.DataFrame], manifest: Mapping[str, Any], about: Mapping[str, Any]) -> dict[str, Any]:
    """The report as JSON-able data: ``about`` (checkpoint, config), then per split the
    per-opponent summary and the per-episode table."""
    report: dict[str, Any] = {"about": dict(about), "splits": {}}
    for split, table in tables.items():
        report["splits"][split] = {
            "opponents": per_opponent(table, manifest).to_dicts(),
            "episodes": per_episode(table, manifest).to_dicts(),
        }
    return report


def headline_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The few numbers ``dvc exp show`` and dashboards compare: per split, pooled over
    opponents, final-episode win rate, mean return, gain, invalid rate and the ratio to the ceiling."""
    out: dict[str, float] = {}
    for split, body in report["splits"].items():
        for row in body["opponents"]:
            prefix = f"{split}/{row['opponent']}"
            for name in ("final_win_rate", "final_mean_return", "win_rate_gain", "return_gain", "invalid_rate",
                         "final_win_vs_ceiling"):
                if row.get(name) is not None:
                    out[f"{prefix}/{name}"] = round(float(row[name]), 6)
    return out


def _fmt(value: Any, digits: int = 2, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return str(value)


def to_markdown(report: Mapping[str, Any]) -> str:
    """Markdown tables a person reads: the summary per opponent, then per episode."""
    about = report["about"]
    lines = [f"# Evaluation report: {about.get('checkpoint', 'base model')}", ""]
    lines += [f"- {key}: {value}" for key, value in about.items() if key != "checkpoint"]
    for split, body in report["splits"].items():
        lines += ["", f"## {split} opponents: first and final episode", "",
                  "| opponent | meta-episodes | first win | final win | win gain | final return | return gain | "
                  "ceiling (win) | final / ceiling | best-response return | invalid rate |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in body["opponents"]:
            lines.append(
                f"| {r['opponent']} | {r['meta_episodes']} | {_fmt(r['first_win_rate'])} | {_fmt(r['final_win_rate'])} | "
                f"{_fmt(r['win_rate_gain'], signed=True)} | {_fmt(r['final_mean_return'], signed=True)} | "
                f"{_fmt(r['return_gain'], signed=True)} | {_fmt(r['max_win_probability'])} | "
                f"{_fmt(r['final_win_vs_ceiling'])} | {_fmt(r['best_response_return'], signed=True)} | "
                f"{_fmt(r['invalid_rate'], 3)} |"
            )
        lines += ["", f"## {split} opponents: per episode k", "",
                  "| opponent | k | played | win rate | draw rate | mean return | pass@k | pass@k / ceiling | "
                  "return / ceiling | invalid rate |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in body["episodes"]:
            lines.append(
                f"| {r['opponent']} | {r['episode']} | {r['played']} | {_fmt(r['win_rate'])} | {_fmt(r['draw_rate'])} | "
                f"{_fmt(r['mean_return'], signed=True)} | {_fmt(r['pass_at_k'])} | {_fmt(r['pass_at_k_vs_ceiling'])} | "
                f"{_fmt(r['return_vs_ceiling'])} | {_fmt(r['invalid_rate'], 3)} |"
            )
    lines += ["", "Ceilings: `max_win_probability` is what a player who sees everything wins; "
              "`best_response_return` is OpenSpiel's best response to the opponent (scaled like the episode "
              "return); both are averaged over the seats played. Monte-Carlo ceilings (MCTS) are lower bounds."]
    return "\n".join(lines) + "\n"


def write_report(report: Mapping[str, Any], directory: str | Path, plots: bool = True,
                 history: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``metrics.json`` (headline numbers), ``report.md`` and the plots."""
    directory = Path(directory)
    written = {
        "report": io.write_json(directory / "report.json", report),
        "metrics": io.write_json(directory / "metrics.json", headline_metrics(report)),
        "markdown": io.write_text(directory / "report.md", to_markdown(report)),
    }
    if plots:
        from mage.plots import plot_learning_curves, plot_success_by_episode

        written["success_by_episode"] = plot_success_by_episode(report, directory / "success_by_episode.png")
        if history:
            written["learning_curves"] = plot_learning_curves(history, directory / "learning_curves.png")
    return written
