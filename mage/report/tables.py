"""The generalisation report of a checkpoint beside the policy it started from (docs/method.md, The metrics).

Input: evaluation trajectory tables per opponent split, of the evaluated checkpoint and
(optionally) of the starting policy (the tiny warm start, or a hub preset's base model),
both played on the same fixed initial states; and the population manifest. Output, per
split and per opponent (and pooled, ``all``):

* first- and final-episode win rate, the final draw and win-or-draw rates, mean returns,
  the first-to-final gain (the exploration-exploitation gain), the invalid-action rate;
* ceilings of what was actually played, **per k**: with early stop the final episode's
  success is pass@N. Three ceilings of pass@k (:mod:`mage.population.ceilings.across_episodes`), each the
  mean over the evaluated initial states: the known-opponent one (``pass_at_k_ceiling``; where
  the manifest has no curve, ``1 - (1 - p_s)^k``, p_s being s's best single-episode win
  probability, exact per deal and seat where the manifest has it, else the seat's figure:
  Monte Carlo against MCTS), and where they are exact, the ``memoryless`` and ``adaptive``
  ones, whose gap is the value of adaptation. ``final_win_vs_ceiling`` divides by the
  known-opponent ceiling of the final episode's k;
  ``final_return_vs_ceiling`` by OpenSpiel's best-response return (null below
  ``MIN_RETURN_CEILING``: a ratio to a loss or to nearly zero says nothing);
* 95% intervals: Wilson for every rate (``<name>_ci``), a group bootstrap for mean returns
  and for paired differences (groups share an initial state, so they are the unit);
* with the starting policy: its figures and the gain over it, paired by initial state;
* the training rollouts in words (``training``): their invalid-reply rate and the update's KL
  to the reference over the last iterations, at the training sampling (its temperature), where
  every other figure is at the evaluation sampling;
* per game held out at evaluation (``games``, ``eval.games``): the same per split, of the same
  checkpoint beside the same starting policy, against that game's own population.

Everything is a pure function of the tables and the manifest (bootstrap seeds are fixed),
so the report's numbers can be recomputed from the trajectory tables alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mage import io
from mage.population.league import rating_rows
from mage.report.intervals import group_bootstrap, wilson
from mage.rollout.metrics import ALL, episode_outcomes, rollout_metrics

MIN_RETURN_CEILING = 0.1  # return units (episode returns are +-5..10): below it a ratio only amplifies noise
META = ["run_id", "iteration", "meta_id"]
#: Rates of a meta-episode summary (0/1 per meta-episode), with their Wilson intervals.
RATES = ("first_win_rate", "final_win_rate", "final_draw_rate", "final_win_or_draw_rate")
#: Figures compared with the starting policy, paired by initial state.
COMPARED = ("final_win_rate", "final_win_or_draw_rate", "final_mean_return", "first_win_rate", "invalid_rate")
#: The report's sentence on the training rollouts averages this many last iterations.
TRAINING_WINDOW = 5


# -- ceilings ------------------------------------------------------------------------------
def _seat_figures(manifest: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    figures = {}
    for opponent in manifest["opponents"]:
        for seat, values in opponent["ceilings"].items():
            if seat.startswith("seat_"):
                figures[(opponent["id"], int(seat.removeprefix("seat_")))] = values
    return figures


def _across_episodes(manifest: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, dict[str, list[float]]]]:
    """(opponent, seat) -> kind -> the per-initial-state pass@k curves of the three ceilings
    across episodes, where the manifest has them (``across_episodes``)."""
    curves = {}
    for opponent in manifest["opponents"]:
        for seat, kinds in (opponent.get("across_episodes") or {}).items():
            if seat.startswith("seat_"):
                curves[(opponent["id"], int(seat.removeprefix("seat_")))] = {
                    kind: figures["per_initial_state"] for kind, figures in kinds.items()}
    return curves


def meta_ceilings(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """Per evaluated meta-episode: ``p_win`` (its initial state's best single-episode win
    probability), ``best_response_return``, how ``p_win`` is known (``ceiling_method``) and,
    where the manifest has them, the three ceilings' pass@k curves of its initial state
    (``known_opponent``, ``memoryless``, ``adaptive``: lists over k, else null)."""
    from mage.games import InitialState, make_game
    from mage.population.ceilings import KINDS, state_key

    figures = _seat_figures(manifest)
    curves = _across_episodes(manifest)
    games: dict[str, Any] = {}
    rows = []
    metas = table.select(*META, "opponent", "seat", "initial_state").unique(subset=META, keep="first")
    for meta in metas.iter_rows(named=True):
        seat = figures.get((meta["opponent"], meta["seat"]))
        if seat is None:
            raise ValueError(f"the population manifest has no ceilings for opponent {meta['opponent']!r} "
                             f"in seat {meta['seat']}: re-seed it (python -m flows seed_population)")
        win = seat["max_win_probability"]
        p_win, method = float(win["value"]), win["method"]
        per_state = win.get("per_initial_state")
        mine = curves.get((meta["opponent"], meta["seat"]), {})
        key = None
        if per_state or mine:
            initial = InitialState.from_json(meta["initial_state"])
            # the manifest's game parameters: a game played through the adapter is OpenSpiel's with them
            params = manifest.get("game_params") or {} if initial.game == manifest.get("game") else {}
            game = games.setdefault(initial.game, make_game(initial.game, **params))
            state = game.openspiel_state(initial)
            key = state_key(state) if state is not None else None
        if per_state and key in per_state:
            p_win, method = float(per_state[key]), "exact, per initial state"
        rows.append({**{k: meta[k] for k in META}, "p_win": p_win, "ceiling_method": method,
                     "best_response_return": float(seat["best_response_return"]["value"]),
                     **{kind: mine.get(kind, {}).get(key) for kind in KINDS}})
    schema = {"run_id": pl.String, "iteration": pl.Int64, "meta_id": pl.Int64, "p_win": pl.Float64,
              "ceiling_method": pl.String, "best_response_return": pl.Float64,
              **{kind: pl.List(pl.Float64) for kind in KINDS}}
    return pl.DataFrame(rows, schema=schema)


def ceilings_at(metas: pl.DataFrame, k: int) -> dict[str, float | None]:
    """The three ceilings of pass@k over the meta-episodes ``metas`` (:func:`meta_ceilings`'
    columns), each the mean over their initial states: ``known_opponent`` from its curve where
    the manifest has one, else ``1 - (1 - p_win)^k`` (exact for an opponent that does not
    remember); ``memoryless`` and ``adaptive`` where every meta-episode has them up to k, else
    None."""
    out: dict[str, float | None] = {}
    p_win = metas["p_win"].to_numpy()
    known = [curve[k - 1] if curve is not None and len(curve) >= k else 1.0 - (1.0 - p) ** k
             for curve, p in zip(metas["known_opponent"].to_list(), p_win)]
    out["known_opponent"] = float(np.mean(known)) if known else None
    for kind in ("memoryless", "adaptive"):
        curves = metas[kind].to_list()
        usable = bool(curves) and all(curve is not None and len(curve) >= k for curve in curves)
        out[kind] = float(np.mean([curve[k - 1] for curve in curves])) if usable else None
    return out


# -- per meta-episode ----------------------------------------------------------------------
def meta_summaries(table: pl.DataFrame, manifest: Mapping[str, Any]) -> pl.DataFrame:
    """One row per meta-episode: first and final (last played) episode, invalid calls, the
    ceilings of its initial state, and its group (the bootstrap's unit)."""
    outcomes = episode_outcomes(table)
    ends = outcomes.group_by(META).agg(
        pl.col("opponent").first(),
        pl.col("group_id").first(),
        pl.col("seat").first(),
        pl.col("won").sort_by("episode").first().cast(pl.Float64).alias("first_won"),
        pl.col("episode_return").sort_by("episode").first().alias("first_return"),
        pl.col("won").sort_by("episode").last().cast(pl.Float64).alias("final_won"),
        pl.col("draw").sort_by("episode").last().cast(pl.Float64).alias("final_draw"),
        pl.col("episode_return").sort_by("episode").last().alias("final_return"),
        pl.col("episode").max().alias("episodes_played"),
    )
    play = table.filter(pl.col("phase") == "play").group_by(META).agg(
        pl.len().alias("play_calls"), (~pl.col("valid")).sum().cast(pl.Float64).alias("invalid_calls"))
    initial = table.select(*META, "initial_state").unique(subset=META, keep="first")
    return (
        ends.join(play, on=META, how="left").join(initial, on=META, how="left")
        .join(meta_ceilings(table, manifest), on=META, how="left")
        .with_columns(
            (pl.col("final_won") + pl.col("final_draw")).alias("final_won_or_drew"),
            pl.col("play_calls").fill_null(0), pl.col("invalid_calls").fill_null(0.0),
        )
        .sort(*META)
    )


def _groups(frame: pl.DataFrame, value: str, count: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per group (opponent, group id), in that order: the sum of ``value`` and the count (rows
    or ``count``). The order is the bootstrap's: its seeded resamples pick groups by position,
    and polars' ``group_by`` returns groups in an arbitrary order that changes from run to run."""
    summed = frame.group_by("opponent", "group_id").agg(
        pl.col(value).sum().alias("s"), (pl.col(count).sum() if count else pl.len()).cast(pl.Float64).alias("n"))
    summed = summed.filter(pl.col("n") > 0).sort("opponent", "group_id")
    return summed["s"].to_numpy(), summed["n"].to_numpy()


def _rate(successes: float, trials: int) -> tuple[float | None, list[float] | None]:
    interval = wilson(successes, trials)
    return (successes / trials if trials else None), (list(interval) if interval else None)


def _ratio(value: float | None, ceiling: float | None, floor: float = 1e-9) -> float | None:
    return None if value is None or ceiling is None or ceiling < floor else value / ceiling


def summarise(metas: pl.DataFrame, label: str, episodes: int, early_stop: bool) -> dict[str, Any]:
    """The report's row of one opponent (or of ``all``) from its meta-episode summaries."""
    n = metas.height
    row: dict[str, Any] = {"opponent": label, "meta_episodes": n}
    for name, column in (("first_win_rate", "first_won"), ("final_win_rate", "final_won"),
                         ("final_draw_rate", "final_draw"), ("final_win_or_draw_rate", "final_won_or_drew")):
        row[name], row[f"{name}_ci"] = _rate(float(metas[column].sum()), n)
    for name, column in (("first_mean_return", "first_return"), ("final_mean_return", "final_return")):
        row[name] = float(metas[column].mean())
        row[f"{name}_ci"] = list(group_bootstrap(*_groups(metas, column)))
    gains = metas.with_columns((pl.col("final_won") - pl.col("first_won")).alias("d_win"),
                               (pl.col("final_return") - pl.col("first_return")).alias("d_return"))
    row["win_rate_gain"] = row["final_win_rate"] - row["first_win_rate"]
    row["win_rate_gain_ci"] = list(group_bootstrap(*_groups(gains, "d_win")))
    row["return_gain"] = row["final_mean_return"] - row["first_mean_return"]
    row["return_gain_ci"] = list(group_bootstrap(*_groups(gains, "d_return")))
    row["mean_episodes_played"] = float(metas["episodes_played"].mean())
    calls = int(metas["play_calls"].sum())
    row["invalid_rate"], row["invalid_rate_ci"] = _rate(float(metas["invalid_calls"].sum()), calls)
    # ceilings of exactly the initial states played, per k
    final_k = episodes if early_stop else 1
    row["max_win_probability"] = ceilings_at(metas, 1)["known_opponent"]
    final = ceilings_at(metas, final_k)
    row["win_ceiling_final"] = final["known_opponent"]
    row["memoryless_ceiling_final"], row["adaptive_ceiling_final"] = final["memoryless"], final["adaptive"]
    row["final_win_vs_ceiling"] = _ratio(row["final_win_rate"], row["win_ceiling_final"])
    row["final_win_vs_ceiling_ci"] = (None if row["final_win_vs_ceiling"] is None else
                                      [bound / row["win_ceiling_final"] for bound in row["final_win_rate_ci"]])
    row["first_win_vs_ceiling"] = _ratio(row["first_win_rate"], row["max_win_probability"])
    methods = sorted(set(metas["ceiling_method"].to_list()))
    row["ceiling_method"] = methods[0] if len(methods) == 1 else "mixed"
    row["best_response_return"] = float(metas["best_response_return"].mean())
    row["final_return_vs_ceiling"] = _ratio(row["final_mean_return"], row["best_response_return"], MIN_RETURN_CEILING)
    return row


def per_opponent(table: pl.DataFrame, manifest: Mapping[str, Any], episodes: int, early_stop: bool = True
                 ) -> list[dict[str, Any]]:
    """Per opponent and pooled (``all`` last): see the module docstring."""
    metas = meta_summaries(table, manifest)
    rows = [summarise(frame, name, episodes, early_stop)
            for (name,), frame in sorted(metas.group_by("opponent"), key=lambda item: item[0])]
    return rows + [summarise(metas, ALL, episodes, early_stop)]


def per_episode(table: pl.DataFrame, manifest: Mapping[str, Any], episodes: int | None = None
                ) -> list[dict[str, Any]]:
    """Per opponent (and ``all``) and episode k: outcomes, pass@k with its interval, the
    ceiling of pass@k and the ratio, the return ratio, invalid rate. With ``episodes``, every k
    up to it has a row: where no meta-episode reached k (with early stop, each had won before
    it), nothing was played (``played`` 0, the outcomes None) and pass@k is pass@(k - 1)."""
    metas = meta_summaries(table, manifest)
    by_opponent = {name: frame for (name,), frame in metas.group_by("opponent")} | {ALL: metas}
    returns = {name: float(frame["best_response_return"].mean()) for (name,), frame in metas.group_by("opponent")}
    returns[ALL] = float(metas["best_response_return"].mean())
    rows = []
    for row in _every_k(rollout_metrics(table).to_dicts(), episodes):
        k, name = row["episode"], row["opponent"]
        wins = round(row["pass_at_k"] * row["meta_episodes"])
        row["pass_at_k_ci"] = list(wilson(wins, row["meta_episodes"]) or ())
        row["win_rate_ci"] = list(wilson(round(row["win_rate"] * row["played"]), row["played"]) or ()) if row["played"] else []
        bounds = ceilings_at(by_opponent[name], k)
        row["pass_at_k_ceiling"] = bounds["known_opponent"]
        row["memoryless_ceiling"], row["adaptive_ceiling"] = bounds["memoryless"], bounds["adaptive"]
        row["pass_at_k_vs_ceiling"] = _ratio(row["pass_at_k"], row["pass_at_k_ceiling"])
        row["best_response_return"] = returns[name]
        row["return_vs_ceiling"] = _ratio(row["mean_return"], returns[name], MIN_RETURN_CEILING)
        rows.append(row)
    return rows


def _every_k(rows: list[dict[str, Any]], episodes: int | None) -> list[dict[str, Any]]:
    """``rows`` (rollout metrics per opponent and k, opponents in order) with a row for every k
    up to ``episodes`` that no meta-episode reached: nothing played, pass@k carried over."""
    if episodes is None:
        return rows
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        out.append(row)
        if index + 1 == len(rows) or rows[index + 1]["opponent"] != row["opponent"]:  # the opponent's last k
            for k in range(row["episode"] + 1, episodes + 1):
                out.append({**{key: None for key in row}, "opponent": row["opponent"], "episode": k,
                            "meta_episodes": row["meta_episodes"], "played": 0, "pass_at_k": row["pass_at_k"]})
    return out


# -- against the starting policy -----------------------------------------------------------
def gains_over_start(final: pl.DataFrame, start: pl.DataFrame, manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per opponent (and ``all``): each of ``COMPARED`` for the start and the evaluated policy
    and their difference, with a bootstrap interval over initial states (the pairs)."""
    key = ["opponent", "meta_id", "initial_state"]
    columns = {"final_win_rate": "final_won", "final_win_or_draw_rate": "final_won_or_drew",
               "final_mean_return": "final_return", "first_win_rate": "first_won"}

    def per_meta(table: pl.DataFrame) -> pl.DataFrame:
        return meta_summaries(table, manifest).select(*key, "group_id", *columns.values(), "invalid_calls", "play_calls")

    evaluated = per_meta(final)
    paired = evaluated.join(per_meta(start), on=key, how="inner", suffix="_start")
    if paired.height != evaluated.height:
        raise ValueError("the starting policy was not evaluated on the same initial states as the checkpoint "
                         f"({paired.height} of {evaluated.height} meta-episodes pair up)")
    rows = []
    for name, frame in [*sorted(((n, f) for (n,), f in paired.group_by("opponent")), key=lambda x: x[0]), (ALL, paired)]:
        row: dict[str, Any] = {"opponent": name, "pairs": frame.height}
        for metric, column in columns.items():
            diff = frame.with_columns((pl.col(column) - pl.col(f"{column}_start")).alias("d"))
            row[f"{metric}_start"] = float(frame[f"{column}_start"].mean())
            row[metric] = float(frame[column].mean())
            row[f"{metric}_gain"] = row[metric] - row[f"{metric}_start"]
            row[f"{metric}_gain_ci"] = list(group_bootstrap(*_groups(diff, "d")))
        invalid = frame["invalid_calls"].sum() / max(frame["play_calls"].sum(), 1)
        invalid_start = frame["invalid_calls_start"].sum() / max(frame["play_calls_start"].sum(), 1)
        row["invalid_rate_start"], row["invalid_rate"] = float(invalid_start), float(invalid)
        row["invalid_rate_gain"] = float(invalid - invalid_start)
        rows.append(row)
    return rows


# -- the training rollouts ----------------------------------------------------------------
def _mean(records: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _figure(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.3g}"


def training_summary(history: Sequence[Mapping[str, Any]], temperature: float | None,
                     window: int = TRAINING_WINDOW) -> dict[str, Any]:
    """The training rollouts of the run (its ``metrics.jsonl`` records), in numbers and in
    one sentence: the invalid-reply rate (``rollout/invalid_rate``) and the update's KL to
    the reference (``train/kl``), each the mean over the last ``window`` recorded iterations,
    and the invalid-reply rate of the first. They are at the training sampling (its
    ``temperature``), not at the evaluation's, which the other figures use."""
    records = sorted((r for r in history if r.get("iteration") is not None), key=lambda r: r["iteration"])
    if not records:
        return {"iterations": 0, "temperature": temperature,
                "sentence": "Training rollouts: no training iteration is recorded for this run."}
    last = records[-window:]
    summary: dict[str, Any] = {
        "iterations": len(records), "temperature": temperature,
        "window": [last[0]["iteration"], last[-1]["iteration"]], "window_iterations": len(last),
        "invalid_rate": _mean(last, "rollout/invalid_rate"), "kl": _mean(last, "train/kl"),
        "first_iteration": records[0]["iteration"], "invalid_rate_first": _mean(records[:1], "rollout/invalid_rate"),
    }
    at = "" if temperature is None else f" (temperature {temperature:g})"
    span = (f"iteration {last[0]['iteration']}, the last" if len(last) == 1 else
            f"iterations {last[0]['iteration']}-{last[-1]['iteration']}, the last {len(last)}")
    summary["sentence"] = (
        f"Training rollouts{at}: invalid replies {_figure(summary['invalid_rate'])} over {span} "
        f"({_figure(summary['invalid_rate_first'])} at iteration {summary['first_iteration']}), "
        f"KL to the reference {_figure(summary['kl'])} over the same iterations. The training curves are at "
        "the training sampling; "
        "the evaluation figures at the evaluation sampling.")
    return summary


def split_sections(tables: Mapping[str, pl.DataFrame], manifest: Mapping[str, Any], episodes: int,
                   early_stop: bool = True, start_tables: Mapping[str, pl.DataFrame] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """Per split of one game's ``tables``: the per-opponent summary, the per-episode table and,
    with ``start_tables``, the starting policy's summary and the gains over it."""
    sections = {}
    for split, table in tables.items():
        body = {"opponents": per_opponent(table, manifest, episodes, early_stop),
                "episodes": per_episode(table, manifest, episodes)}
        if start_tables is not None and split in start_tables:
            start = start_tables[split]
            body["start"] = {"opponents": per_opponent(start, manifest, episodes, early_stop),
                             "episodes": per_episode(start, manifest, episodes)}
            body["gains"] = gains_over_start(table, start, manifest)
        sections[split] = body
    return sections


def held_out_game(tables: Mapping[str, pl.DataFrame], manifest: Mapping[str, Any], episodes: int,
                  early_stop: bool = True, start_tables: Mapping[str, pl.DataFrame] | None = None,
                  exploitability: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A game held out at evaluation (``eval.games``), as :func:`build_report` takes it: what it is
    (``about``: the game and its parameters, from its ``manifest``), its :func:`split_sections`
    and, where it is measured, the ``exploitability`` of either side."""
    game: dict[str, Any] = {"about": {"game": manifest["game"], "game_params": manifest.get("game_params")},
                            "splits": split_sections(tables, manifest, episodes, early_stop, start_tables)}
    if exploitability:
        game["exploitability"] = {side: dict(figures) for side, figures in exploitability.items()}
    return game


def build_report(tables: Mapping[str, pl.DataFrame], manifest: Mapping[str, Any], about: Mapping[str, Any],
                 episodes: int, early_stop: bool = True,
                 start_tables: Mapping[str, pl.DataFrame] | None = None,
                 history: Sequence[Mapping[str, Any]] = (), training_temperature: float | None = None,
                 exploitability: Mapping[str, Mapping[str, Any]] | None = None,
                 games: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The report as JSON-able data: ``about`` (what was evaluated, and where it started),
    ``training`` (:func:`training_summary` of the run's ``history``, sampled at
    ``training_temperature``), then per split the per-opponent summary, the per-episode table
    and, with ``start_tables``, the starting policy's summary and the gains over it. Kuhn
    Poker's ``exploitability`` (:mod:`mage.evaluation.exploitability`), of the ``policy`` and of its
    ``start``, goes in as it is. ``games``: the games held out at evaluation, each a
    :func:`held_out_game`, by name."""
    report: dict[str, Any] = {"about": dict(about) | {"episodes": episodes, "early_stop": early_stop},
                              "training": training_summary(history, training_temperature), "splits": {}}
    if exploitability:
        report["exploitability"] = {side: dict(figures) for side, figures in exploitability.items()}
    ratings = rating_rows(history[-1:])
    if ratings:  # population.league: the ratings after the last recorded iteration
        report["league"] = ratings
    report["splits"] = split_sections(tables, manifest, episodes, early_stop, start_tables)
    if games:
        report["games"] = {name: dict(game) for name, game in games.items()}
    return report


def headline_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """What ``dvc exp show`` compares, per split pooled over its opponents: the final-episode
    win rate (and win-or-draw rate), its ratio to the ceiling, the gain over the starting
    policy, the first-to-final gain, the mean return and the invalid rate; on Kuhn Poker the
    policy's exploitability and value against a best response (``start_``: its starting policy's).
    The same for each game held out at evaluation, under its name (``leduc_poker/held_out/...``,
    ``leduc_poker/exploitability``)."""
    out: dict[str, float] = {}
    for scope, part in [("", report), *((f"{game}/", section) for game, section in report.get("games", {}).items())]:
        for split, body in part["splits"].items():
            pooled = next(r for r in body["opponents"] if r["opponent"] == ALL)
            for name in ("final_win_rate", "final_win_or_draw_rate", "final_win_vs_ceiling", "win_rate_gain",
                         "final_mean_return", "invalid_rate"):
                if pooled.get(name) is not None:
                    out[f"{scope}{split}/{name}"] = round(float(pooled[name]), 6)
            gains = next((r for r in body.get("gains", []) if r["opponent"] == ALL), None)
            if gains is not None:
                out[f"{scope}{split}/start_final_win_rate"] = round(gains["final_win_rate_start"], 6)
                for metric, name in (("final_win_rate", "gain_over_start"),
                                     ("final_win_or_draw_rate", "win_or_draw_gain_over_start")):
                    out[f"{scope}{split}/{name}"] = round(gains[f"{metric}_gain"], 6)
                    if gains[f"{metric}_gain_ci"]:  # the 95% interval: a gain counts when low > 0
                        low, high = gains[f"{metric}_gain_ci"]
                        out[f"{scope}{split}/{name}_low"] = round(low, 6)
                        out[f"{scope}{split}/{name}_high"] = round(high, 6)
        for side, prefix in (("policy", ""), ("start", "start_")):
            figures = part.get("exploitability", {}).get(side)
            if figures is not None:  # Kuhn Poker, in chips per hand
                out[f"{scope}{prefix}exploitability"] = round(figures["exploitability"], 6)
                out[f"{scope}{prefix}value_vs_best_response"] = round(figures["value_vs_best_response"]["mean"], 6)
    return out


def write_report(report: Mapping[str, Any], directory: str | Path, plots: bool = True,
                 history: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``metrics.json`` (headline numbers), ``report.md`` and the plots
    (each game held out at evaluation: ``success_by_episode-<game>.png``, ``gains-<game>.png``)."""
    from mage.report.markdown import to_markdown

    directory = Path(directory)
    written = {
        "report": io.write_json(directory / "report.json", report),
        "metrics": io.write_json(directory / "metrics.json", headline_metrics(report)),
        "markdown": io.write_text(directory / "report.md", to_markdown(report)),
    }
    if plots:
        from mage.report.plots import (
            has_adaptation_ceilings,
            plot_adaptation,
            plot_gains,
            plot_learning_curves,
            plot_success_by_episode,
        )

        written["success_by_episode"] = plot_success_by_episode(report, directory / "success_by_episode.png")
        if has_adaptation_ceilings(report):
            written["adaptation"] = plot_adaptation(report, directory / "adaptation.png")
        if any("gains" in body for body in report["splits"].values()):
            written["gains"] = plot_gains(report, directory / "gains.png")
        if history:
            written["learning_curves"] = plot_learning_curves(history, directory / "learning_curves.png",
                                                              report.get("training"))
        for game, section in report.get("games", {}).items():  # a game held out at evaluation: its own plots
            view = {"about": report["about"],
                    "splits": {f"{game}, {split}": body for split, body in section["splits"].items()}}
            written[f"success_by_episode-{game}"] = plot_success_by_episode(
                view, directory / f"success_by_episode-{game}.png")
            if any("gains" in body for body in section["splits"].values()):
                written[f"gains-{game}"] = plot_gains(view, directory / f"gains-{game}.png")
    return written
