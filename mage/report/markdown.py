"""The report as Markdown: what a person reads first (``report.md``, the Prefect artifact)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def fmt(value: Any, digits: int = 2, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return str(value)


def with_ci(value: Any, interval: Sequence[float] | None, digits: int = 2, signed: bool = False) -> str:
    """``0.47 [0.42, 0.52]``: a figure with its 95% interval."""
    if value is None:
        return "-"
    if not interval:
        return fmt(value, digits, signed)
    return f"{fmt(value, digits, signed)} [{fmt(interval[0], digits, signed)}, {fmt(interval[1], digits, signed)}]"


def _about(about: Mapping[str, Any]) -> list[str]:
    lines = [f"# Evaluation report: {about.get('checkpoint', 'base model')}", ""]
    return lines + [f"- {key}: {value}" for key, value in about.items() if key != "checkpoint"]


def _table(heading: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown section: a blank line, the heading, then the table."""
    lines = ["", f"## {heading}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _gains(split: str, rows: Sequence[Mapping[str, Any]], start: str) -> list[str]:
    columns = ("opponent", "pairs", "final win: start", "final win: now", "gain [95% CI]", "win or draw: start",
               "win or draw: now", "gain [95% CI]", "final return: gain [95% CI]", "invalid: start -> now")
    return _table(f"{split} opponents: did it learn? ({start} -> evaluated, paired by initial state)", columns, (
        (r["opponent"], fmt(r["pairs"]), fmt(r["final_win_rate_start"]), fmt(r["final_win_rate"]),
         with_ci(r["final_win_rate_gain"], r["final_win_rate_gain_ci"], signed=True),
         fmt(r["final_win_or_draw_rate_start"]), fmt(r["final_win_or_draw_rate"]),
         with_ci(r["final_win_or_draw_rate_gain"], r["final_win_or_draw_rate_gain_ci"], signed=True),
         with_ci(r["final_mean_return_gain"], r["final_mean_return_gain_ci"], signed=True),
         f"{fmt(r['invalid_rate_start'], 3)} -> {fmt(r['invalid_rate'], 3)}")
        for r in rows))


def _opponents(split: str, rows: Sequence[Mapping[str, Any]], title: str) -> list[str]:
    columns = ("opponent", "meta-episodes", "first win", "final win [95% CI]", "first -> final gain", "win or draw",
               "final return [95% CI]", "ceiling (first / final k)", "final / ceiling", "invalid rate")
    return _table(f"{split} opponents: {title}", columns, (
        (r["opponent"], fmt(r["meta_episodes"]), fmt(r["first_win_rate"]),
         with_ci(r["final_win_rate"], r["final_win_rate_ci"]),
         with_ci(r["win_rate_gain"], r["win_rate_gain_ci"], signed=True), fmt(r["final_win_or_draw_rate"]),
         with_ci(r["final_mean_return"], r["final_mean_return_ci"], signed=True),
         f"{fmt(r['max_win_probability'])} / {fmt(r['win_ceiling_final'])}",
         with_ci(r["final_win_vs_ceiling"], r["final_win_vs_ceiling_ci"]), fmt(r["invalid_rate"], 3))
        for r in rows))


def _episodes(split: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    columns = ("opponent", "k", "played", "win rate", "draw rate", "mean return", "pass@k [95% CI]",
               "ceiling of pass@k", "pass@k / ceiling", "return / ceiling", "invalid rate")
    return _table(f"{split} opponents: per episode k", columns, (
        (r["opponent"], fmt(r["episode"]), fmt(r["played"]), fmt(r["win_rate"]), fmt(r["draw_rate"]),
         fmt(r["mean_return"], signed=True), with_ci(r["pass_at_k"], r["pass_at_k_ci"]), fmt(r["pass_at_k_ceiling"]),
         fmt(r["pass_at_k_vs_ceiling"]), fmt(r["return_vs_ceiling"]), fmt(r["invalid_rate"], 3))
        for r in rows))


def _adaptation(split: str, body: Mapping[str, Any]) -> list[str]:
    """Pooled success by k beside the three ceilings (where the memoryless and adaptive ones
    are exact), the starting policy's too: is the policy using what earlier episodes showed?"""
    rows = [r for r in body["episodes"] if r["opponent"] == "all" and r.get("adaptive_ceiling") is not None]
    if not rows:
        return []
    start = {r["episode"]: r for r in body.get("start", {}).get("episodes", []) if r["opponent"] == "all"}
    columns = ("k", "pass@k [95% CI]", "start", "memoryless ceiling", "adaptive ceiling",
               "value of adaptation", "known-opponent ceiling")
    return _table(f"{split} opponents: success by episode k against the three ceilings", columns, (
        (fmt(r["episode"]), with_ci(r["pass_at_k"], r["pass_at_k_ci"]),
         fmt(start[r["episode"]]["pass_at_k"]) if r["episode"] in start else "-", fmt(r["memoryless_ceiling"]),
         fmt(r["adaptive_ceiling"]), fmt(r["adaptive_ceiling"] - r["memoryless_ceiling"], signed=True),
         fmt(r["pass_at_k_ceiling"]))
        for r in rows)) + ["", ("Above the memoryless ceiling, beyond its interval, a policy uses what earlier episodes "
                               "revealed: no policy that ignores them can get there (docs/method.md, \"Three ceilings "
                               "per episode\").")]


def _exploitability(sides: Mapping[str, Mapping[str, Any]], start: str) -> list[str]:
    """Each side's exploitability (Kuhn Poker, or another game small enough for it:
    mage.evaluation.exploitability), then on Kuhn Poker its policy per information state."""
    names = {"policy": "the evaluated policy", "start": start}
    rows = [(names[side], fmt(f["exploitability"], 4), fmt(f["nash_conv"], 4),
             fmt(f["value_vs_best_response"]["seat_0"], 4, signed=True),
             fmt(f["value_vs_best_response"]["seat_1"], 4, signed=True),
             fmt(f["value_vs_best_response"]["mean"], 4, signed=True)) for side, f in sides.items()]
    first = next(iter(sides.values()))
    game = first.get("game", "Kuhn Poker")  # Kuhn Poker's figures name no game
    lines = _table(f"Exploitability ({game}, {first['units']}, the first episode's policy)",
                   ("policy", "exploitability", "NashConv", "vs best response: player 1", "player 2", "mean"), rows)
    if "action_probabilities" not in first:  # hundreds of information states or more: no per-state table
        return lines + ["", (f"Read from the model by teacher forcing at each of the {first['information_states']:,} "
                             "information states of both players: the probability of replying `<action>move</action>` "
                             "for each legal move, normalised over them; the policy plays both seats. A Nash "
                             "equilibrium is 0 exploitable.")]
    states = list(first["action_probabilities"])
    lines += _table("The first episode's policy: P(bet or call) per information state",
                    ("information state", *(names[side] for side in sides)),
                    ((state, *(fmt(_aggressive(f["action_probabilities"][state]), 3) for f in sides.values())) for state in states))
    return lines + ["", ("Read from the model by teacher forcing: the probability of replying `<action>word</action>` "
                         "for each legal word, normalised over them. A Nash equilibrium is 0 exploitable and gets "
                         "-1/18 as player 1, +1/18 as player 2.")]


def _aggressive(probabilities: Mapping[str, float]) -> float | None:
    """P(bet) where nobody has bet, P(call) facing a bet."""
    return probabilities.get("bet", probabilities.get("call"))


def _sampling(report: Mapping[str, Any]) -> list[str]:
    """Which sampling each figure is at, in words: the training rollouts' (``training``'s
    sentence, beside learning_curves.png) and the evaluation's (every table below)."""
    training = report.get("training")
    temperature = (report["about"].get("sampling") or {}).get("temperature")
    at = "" if temperature is None else f" (temperature {temperature:g})"
    lines = ["", "## Sampling of the figures", ""]
    if training is not None:
        lines += [f"learning_curves.png: {training['sentence']}", ""]
    return [*lines, f"Evaluation figures (the tables below, success_by_episode.png, gains.png): the evaluation sampling{at}."]


def _splits(splits: Mapping[str, Mapping[str, Any]], start: str, compared_with: str | None,
            game: str | None = None) -> list[str]:
    """Per split: the gains over the starting policy (when it was evaluated), the evaluated
    policy per opponent, the starting policy per opponent, the three ceilings, per episode k;
    each heading names the ``game`` when it is one held out at evaluation."""
    lines: list[str] = []
    for split, body in splits.items():
        label = split if game is None else f"{game}, {split}"
        if "gains" in body:
            lines += _gains(label, body["gains"], start)
        lines += _opponents(label, body["opponents"], "the evaluated policy")
        if "start" in body:
            lines += _opponents(label, body["start"]["opponents"], compared_with or "the starting policy")
        lines += _adaptation(label, body)
        lines += _episodes(label, body["episodes"])
    return lines


def _held_out_game(game: str, section: Mapping[str, Any], start: str, compared_with: str | None) -> list[str]:
    """A game held out at evaluation: what it is, then the same tables as the run's own game's."""
    params = section["about"].get("game_params")
    shown = f" (`{json.dumps(params, sort_keys=True)}`)" if params else ""
    lines = ["", f"## Held-out game: {game}", "",
             (f"The same policies on {game}{shown}, a game the evaluated checkpoint "
              "did not train on (`eval.games`): its own prompts and its own population "
              f"(`params/population/{game}.yaml`), the run's evaluation settings.")]
    lines += _splits(section["splits"], start, compared_with, game)
    if section.get("exploitability"):
        lines += _exploitability(section["exploitability"], compared_with or "the starting policy")
    return lines


def to_markdown(report: Mapping[str, Any]) -> str:
    """The sampling of the figures (the training rollouts' numbers in words, see
    :func:`mage.report.tables.training_summary`), then per split: the gains over the starting policy
    (when it was evaluated), the evaluated policy per opponent, the starting policy per
    opponent, then the per-episode table; on Kuhn Poker, the exploitability of both policies;
    then each game held out at evaluation, the same way."""
    lines = _about(report["about"]) + _sampling(report)
    # a checkpoint's tables may stand in for the starting policy's (``compared_with``)
    compared_with = report["about"].get("compared_with")
    start = f"start: {compared_with}" if compared_with else "start"
    lines += _splits(report["splits"], start, compared_with)
    if report.get("league"):
        lines += _table(f"The league after iteration {report['league'][0]['iteration']} (openskill ratings)",
                        ("player", "mu", "sigma", "P(agent wins)", "share of the last iteration's groups"),
                        ((r["player"], fmt(r["mu"]), fmt(r["sigma"]), fmt(r["win_probability"]), fmt(r["share"]))
                         for r in report["league"]))
    if report.get("exploitability"):
        lines += _exploitability(report["exploitability"], compared_with or "the starting policy")
    for game, section in report.get("games", {}).items():
        lines += _held_out_game(game, section, start, compared_with)
    lines += ["", "Intervals are 95%: Wilson for rates, a bootstrap over initial states for returns and gains. "
              "Ceilings are of the initial states played: the first episode's is the best single-episode win "
              "probability p of a player who knows the opponent; with early stop the final episode's success is "
              "pass@N, whose ceiling is the mean of 1 - (1 - p)^N against an opponent that does not remember what "
              "earlier episodes showed. Monte-Carlo ceilings (MCTS) are lower bounds. `return / ceiling` divides by "
              "OpenSpiel's best-response return, where that is at least 0.1."]
    return "\n".join(lines) + "\n"
