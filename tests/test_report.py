"""The generalisation report against a table and a manifest worked by hand."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.report.markdown import to_markdown
from mage.report.tables import build_report, headline_metrics, write_report
from mage.rollout.schema import from_rows

J, Q, K = 0, 1, 2


def row(meta, opponent, seat, cards, episode, turn, *, ret, won, phase="play", valid=True, done=True):
    initial = json.dumps({"game": "kuhn_poker", "seed": meta, "agent_seat": seat, "data": {"cards": cards}})
    return {
        "run_id": "eval", "iteration": 3, "policy_version": 0, "group_id": meta, "meta_id": meta, "game": "kuhn_poker", "opponent": opponent,
        "seat": seat, "seed": meta, "initial_state": initial, "episode": episode, "turn": turn, "phase": phase,
        "observation": "s", "prompt": "", "response": "", "prompt_token_ids": [1], "response_token_ids": [2],
        "response_logprobs": [0.0], "finish_reason": "stop", "dropped_episodes": 0, "action": None, "valid": valid,
        "invalid_reason": None if valid else "x", "step_reward": ret if done else 0.0, "episode_return": ret,
        "won": won, "draw": False, "truncated": False, "done": done,
    }


# Opponent A: meta 0 (seat 0, J vs Q) loses episode 1 with an invalid reply first, then wins
# episode 2 (early stop); meta 1 (seat 1, K vs J) loses, loses, wins.
# Opponent B: meta 2 (seat 0, Q vs K) loses all three episodes.
TABLE = from_rows([
    row(0, "A", 0, [J, Q], 1, 1, ret=-5, won=False, valid=False, done=False),
    row(0, "A", 0, [J, Q], 1, 2, ret=-5, won=False),
    row(0, "A", 0, [J, Q], 2, 0, ret=5, won=True, phase="reflect", done=False),
    row(0, "A", 0, [J, Q], 2, 1, ret=5, won=True),
    row(1, "A", 1, [K, J], 1, 1, ret=-10, won=False),
    row(1, "A", 1, [K, J], 2, 1, ret=-5, won=False),
    row(1, "A", 1, [K, J], 3, 1, ret=10, won=True),
    row(2, "B", 0, [Q, K], 1, 1, ret=-5, won=False),
    row(2, "B", 0, [Q, K], 2, 1, ret=-5, won=False),
    row(2, "B", 0, [Q, K], 3, 1, ret=-10, won=False),
])


def seat(win, ret, per_state=None):
    figure = {"value": win, "method": "exact"} | ({"per_initial_state": per_state} if per_state else {})
    return {"max_win_probability": figure, "best_response_return": {"value": ret, "method": "exact"}}


MANIFEST = {"opponents": [
    # A: exact per deal (OpenSpiel's history strings "c0, c1"): J-Q winnable from seat 0, K-J from seat 1.
    {"id": "A", "split": "train", "ceilings": {"seat_0": seat(0.5, 1.0, {"0, 1": 1.0, "1, 2": 0.0}),
                                               "seat_1": seat(0.75, 2.0, {"2, 0": 1.0})}},
    # B: no per-deal figures (as for a Monte-Carlo ceiling): the seat's mean counts.
    {"id": "B", "split": "train", "ceilings": {"seat_0": seat(0.4, -0.5), "seat_1": seat(0.6, 0.5)}},
]}


def wilson_by_scipy(successes: int, trials: int) -> list[float]:
    from scipy.stats import binomtest

    interval = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(interval.low), float(interval.high)]


def test_per_opponent_summary_by_hand():
    report = build_report({"train": TABLE}, MANIFEST, {"checkpoint": "ckpt-00003"}, episodes=3)
    rows = {r["opponent"]: r for r in report["splits"]["train"]["opponents"]}
    a, b, pooled = rows["A"], rows["B"], rows["all"]
    assert (a["meta_episodes"], a["first_win_rate"], a["final_win_rate"]) == (2, 0.0, 1.0)
    assert a["final_mean_return"] == pytest.approx((5 + 10) / 2) and a["first_mean_return"] == pytest.approx(-7.5)
    assert a["win_rate_gain"] == 1.0 and a["return_gain"] == pytest.approx(15.0)
    # ceilings of the deals played: both of A's deals are winnable -> 1.0 (not the seat means 0.5 / 0.75)
    assert a["max_win_probability"] == 1.0 and a["ceiling_method"] == "exact, per initial state"
    assert a["best_response_return"] == pytest.approx((1.0 + 2.0) / 2)
    assert a["final_win_vs_ceiling"] == 1.0
    assert a["final_return_vs_ceiling"] == pytest.approx(7.5 / 1.5)
    assert a["invalid_rate"] == pytest.approx(1 / 6)  # six play calls (three per meta-episode), one invalid
    # B has only its seat's figure p = 0.4: one try 0.4, and with early stop the final episode is
    # pass@3, whose ceiling is 1 - 0.6^3 = 0.784.
    assert b["max_win_probability"] == 0.4 and b["win_ceiling_final"] == pytest.approx(0.784)
    assert b["final_win_vs_ceiling"] == 0.0
    assert b["final_return_vs_ceiling"] is None  # a ratio to a negative ceiling says nothing
    assert pooled["meta_episodes"] == 3 and pooled["final_win_rate"] == pytest.approx(2 / 3)
    assert pooled["max_win_probability"] == pytest.approx((1.0 + 1.0 + 0.4) / 3)
    assert pooled["win_ceiling_final"] == pytest.approx((1.0 + 1.0 + 0.784) / 3)
    # Wilson intervals, against scipy's implementation
    assert pooled["final_win_rate_ci"] == pytest.approx(wilson_by_scipy(2, 3))
    assert a["first_win_rate_ci"] == pytest.approx(wilson_by_scipy(0, 2))
    assert a["invalid_rate_ci"] == pytest.approx(wilson_by_scipy(1, 6))
    assert pooled["final_win_vs_ceiling_ci"] == pytest.approx([x / pooled["win_ceiling_final"] for x in wilson_by_scipy(2, 3)])
    # Bootstrap intervals of means resample groups: A's two final returns are 5 and 10
    low, high = a["final_mean_return_ci"]
    assert 5.0 <= low <= 7.5 <= high <= 10.0 and (low, high) == (5.0, 10.0)


def test_without_early_stop_the_final_episode_has_the_one_try_ceiling():
    rows = {r["opponent"]: r for r in build_report({"train": TABLE}, MANIFEST, {}, 3, early_stop=False)
            ["splits"]["train"]["opponents"]}
    assert rows["B"]["win_ceiling_final"] == pytest.approx(0.4)


def test_a_three_try_success_against_a_stochastic_opponent_exceeds_the_one_try_ceiling_only_by_noise():
    # Opponent C (seat figure p = 0.5): a meta-episode that wins its third episode has final
    # success 1.0. Against one try's ceiling that reads 2.0; against 1 - 0.5^3 = 0.875 it reads
    # 1.14, and the interval, from 0.21 / 0.875, shows that one sample says little.
    table = from_rows([
        row(7, "C", 0, [J, Q], 1, 1, ret=-5, won=False),
        row(7, "C", 0, [J, Q], 2, 1, ret=-5, won=False),
        row(7, "C", 0, [J, Q], 3, 1, ret=5, won=True),
    ])
    manifest = {"opponents": [{"id": "C", "split": "train", "ceilings": {"seat_0": seat(0.5, 1.0), "seat_1": seat(0.5, 1.0)}}]}
    (c, _) = build_report({"train": table}, manifest, {}, 3)["splits"]["train"]["opponents"]
    assert c["win_ceiling_final"] == pytest.approx(0.875) and c["final_win_vs_ceiling"] == pytest.approx(1 / 0.875)
    assert c["final_win_vs_ceiling_ci"][0] < 1.0 < c["final_win_vs_ceiling_ci"][1]


def test_per_episode_table_by_hand():
    report = build_report({"train": TABLE}, MANIFEST, {}, episodes=3)
    episodes = {(r["opponent"], r["episode"]): r for r in report["splits"]["train"]["episodes"]}
    # A: episode 1 played by both (0 wins), episode 2 by both (meta 0 wins), episode 3 by meta 1 only (wins)
    assert [episodes[("A", k)]["played"] for k in (1, 2, 3)] == [2, 2, 1]
    assert [episodes[("A", k)]["win_rate"] for k in (1, 2, 3)] == [0.0, 0.5, 1.0]
    assert [episodes[("A", k)]["pass_at_k"] for k in (1, 2, 3)] == [0.0, 0.5, 1.0]
    assert [episodes[("A", k)]["mean_return"] for k in (1, 2, 3)] == pytest.approx([-7.5, 0.0, 10.0])
    assert episodes[("A", 1)]["invalid_rate"] == pytest.approx(1 / 3)
    assert episodes[("A", 2)]["pass_at_k_vs_ceiling"] == 0.5
    assert episodes[("all", 3)]["pass_at_k"] == pytest.approx(2 / 3)
    # the ceiling of pass@k follows k: B's p = 0.4 gives 0.4, 0.64, 0.784
    assert [episodes[("B", k)]["pass_at_k_ceiling"] for k in (1, 2, 3)] == pytest.approx([0.4, 0.64, 0.784])
    assert episodes[("all", 2)]["pass_at_k_ceiling"] == pytest.approx((1 + 1 + 0.64) / 3)
    assert episodes[("A", 2)]["pass_at_k_ci"] == pytest.approx(wilson_by_scipy(1, 2))


def with_curves(manifest, curves):
    """``manifest`` with the three ceilings across episodes of ``curves``: (opponent, seat) ->
    kind -> {state key: [pass@1, pass@2, pass@3]}."""
    opponents = []
    for opponent in manifest["opponents"]:
        mine = {f"seat_{s}": {kind: {"value": [], "per_initial_state": states} for kind, states in kinds.items()}
                for (name, s), kinds in curves.items() if name == opponent["id"]}
        opponents.append(opponent | {"across_episodes": mine})
    return {"opponents": opponents}


def test_the_three_ceilings_per_k_by_hand():
    # A remembers the agent's earlier episodes (its known-opponent curve is not 1 - (1 - p)^k), B does
    # not and has a curve only for memoryless and adaptive: its known-opponent ceiling stays the formula.
    manifest = with_curves(MANIFEST, {
        ("A", 0): {"known_opponent": {"0, 1": [0.5, 1.0, 1.0]}, "memoryless": {"0, 1": [0.2, 0.4, 0.6]},
                   "adaptive": {"0, 1": [0.2, 0.9, 1.0]}},
        ("A", 1): {"known_opponent": {"2, 0": [0.3, 0.8, 0.9]}, "memoryless": {"2, 0": [0.1, 0.2, 0.3]},
                   "adaptive": {"2, 0": [0.1, 0.5, 0.7]}},
        ("B", 0): {"memoryless": {"1, 2": [0.0, 0.5, 0.5]}, "adaptive": {"1, 2": [0.0, 0.5, 0.75]}},
    })
    report = build_report({"train": TABLE}, manifest, {}, episodes=3)
    episodes = {(r["opponent"], r["episode"]): r for r in report["splits"]["train"]["episodes"]}
    assert [episodes[("A", k)]["pass_at_k_ceiling"] for k in (1, 2, 3)] == pytest.approx([0.4, 0.9, 0.95])
    assert [episodes[("A", k)]["memoryless_ceiling"] for k in (1, 2, 3)] == pytest.approx([0.15, 0.3, 0.45])
    assert [episodes[("A", k)]["adaptive_ceiling"] for k in (1, 2, 3)] == pytest.approx([0.15, 0.7, 0.85])
    assert [episodes[("B", k)]["pass_at_k_ceiling"] for k in (1, 2, 3)] == pytest.approx([0.4, 0.64, 0.784])
    assert [episodes[("all", k)]["adaptive_ceiling"] for k in (1, 2, 3)] == pytest.approx(
        [(0.2 + 0.1 + 0.0) / 3, (0.9 + 0.5 + 0.5) / 3, (1.0 + 0.7 + 0.75) / 3])
    pooled = next(r for r in report["splits"]["train"]["opponents"] if r["opponent"] == "all")
    assert pooled["memoryless_ceiling_final"] == pytest.approx((0.6 + 0.3 + 0.5) / 3)
    assert pooled["win_ceiling_final"] == pytest.approx((1.0 + 0.9 + 0.784) / 3)
    # a meta-episode without curves (the manifest has none for B in seat 1, or k past them) leaves none
    without = with_curves(MANIFEST, {("A", 0): {"memoryless": {"0, 1": [0.2]}, "adaptive": {"0, 1": [0.2]}}})
    rows = build_report({"train": TABLE}, without, {}, episodes=3)["splits"]["train"]["episodes"]
    assert all(r["memoryless_ceiling"] is None for r in rows if r["opponent"] != "A" or r["episode"] > 1)
    markdown = to_markdown(report)
    assert "## train opponents: success by episode k against the three ceilings" in markdown
    # k = 2: memoryless (0.4 + 0.2 + 0.5) / 3, adaptive (0.9 + 0.5 + 0.5) / 3, known (1.0 + 0.8 + 0.64) / 3
    assert "| 2 | 0.33 [0.06, 0.79] | - | 0.37 | 0.63 | +0.27 | 0.81 |" in markdown
    assert "success by episode k against the three ceilings" not in to_markdown(
        build_report({"train": TABLE}, MANIFEST, {}, episodes=3))


def test_a_k_that_no_meta_episode_reached_keeps_its_row():
    # every meta-episode of A won by episode 2 (meta 1's third episode dropped): nobody played 3
    won_early = TABLE.filter(~((pl.col("meta_id") == 1) & (pl.col("episode") == 3))).with_columns(
        pl.when(pl.col("meta_id") == 1).then(pl.col("episode") == 2).otherwise(pl.col("won")).alias("won"))
    rows = {(r["opponent"], r["episode"]): r for r in build_report({"train": won_early}, MANIFEST, {}, 3)
            ["splits"]["train"]["episodes"]}
    assert (rows[("A", 2)]["pass_at_k"], rows[("A", 3)]["pass_at_k"]) == (1.0, 1.0)
    assert rows[("A", 3)]["played"] == 0 and rows[("A", 3)]["win_rate"] is None
    assert rows[("A", 3)]["pass_at_k_ci"] == pytest.approx(wilson_by_scipy(2, 2))
    assert rows[("B", 3)]["played"] == 1  # B played its third episode: its own row, as before
    assert "| A | 3 | 0 | - | - | - | 1.00 [0.34, 1.00] |" in to_markdown(build_report({"train": won_early}, MANIFEST, {}, 3))


def start_of(table):
    """The starting policy on the same initial states: every meta-episode loses all three episodes."""
    rows = []
    for meta, opponent, seat_, cards in ((0, "A", 0, [J, Q]), (1, "A", 1, [K, J]), (2, "B", 0, [Q, K])):
        rows += [row(meta, opponent, seat_, cards, k, 1, ret=-5, won=False, valid=k != 1) for k in (1, 2, 3)]
    return from_rows(rows).with_columns(pl.lit(0).alias("iteration"))


def test_gains_over_the_starting_policy_by_hand():
    report = build_report({"train": TABLE}, MANIFEST, {}, 3, start_tables={"train": start_of(TABLE)})
    gains = {r["opponent"]: r for r in report["splits"]["train"]["gains"]}
    a, pooled = gains["A"], gains["all"]
    assert (a["pairs"], a["final_win_rate_start"], a["final_win_rate"], a["final_win_rate_gain"]) == (2, 0.0, 1.0, 1.0)
    assert a["final_mean_return_gain"] == pytest.approx((5 + 10) / 2 - (-5))
    assert pooled["final_win_rate_gain"] == pytest.approx(2 / 3)
    # the start's invalid rate: episode 1 of each of 3 meta-episodes invalid, out of 9 calls
    assert pooled["invalid_rate_start"] == pytest.approx(3 / 9) and pooled["invalid_rate"] == pytest.approx(1 / 9)
    # gains resample the pairs: A's two pairs both gained 1.0, so its interval is [1, 1]
    assert a["final_win_rate_gain_ci"] == [1.0, 1.0]
    low, high = pooled["final_win_rate_gain_ci"]
    assert 0.0 <= low < 2 / 3 < high <= 1.0
    metrics = headline_metrics(report)
    assert metrics["train/gain_over_start"] == pytest.approx(2 / 3) and metrics["train/start_final_win_rate"] == 0.0
    # the start's own summary sits beside the evaluated one
    start_rows = {r["opponent"]: r for r in report["splits"]["train"]["start"]["opponents"]}
    assert start_rows["all"]["final_win_rate"] == 0.0 and start_rows["all"]["invalid_rate"] == pytest.approx(3 / 9)


def test_a_start_evaluated_elsewhere_is_refused():
    moved = start_of(TABLE).with_columns(pl.col("meta_id") + 100)
    with pytest.raises(ValueError, match="same initial states"):
        build_report({"train": TABLE}, MANIFEST, {}, 3, start_tables={"train": moved})


def test_no_return_ratio_to_a_near_zero_ceiling():
    # Against an equilibrium opponent a best response earns about the game's value (0 over both
    # Kuhn seats): -10 / 0.01 = -1000 would say nothing, so the ratio is null below 0.1.
    near_zero = {"opponents": [MANIFEST["opponents"][0], {"id": "B", "split": "train", "ceilings": {
        "seat_0": seat(0.4, 0.01), "seat_1": seat(0.6, 0.01)}}]}
    rows = {r["opponent"]: r for r in build_report({"train": TABLE}, near_zero, {}, 3)["splits"]["train"]["opponents"]}
    assert rows["B"]["best_response_return"] == pytest.approx(0.01)
    assert rows["B"]["final_return_vs_ceiling"] is None
    assert rows["A"]["final_return_vs_ceiling"] == pytest.approx(5.0)


def test_written_report_files(tmp_path):
    report = build_report({"train": TABLE}, MANIFEST, {"checkpoint": "ckpt-00003"}, 3,
                          start_tables={"train": start_of(TABLE)})
    history = [{"iteration": i, "rollout/all/final_win_rate": 0.1 * i, "rollout/A/final_win_rate": 0.2 * i,
                "rollout/all/final_mean_return": i, "rollout/all/first_mean_return": -i, "rollout/invalid_rate": 0.01,
                "train/kl": 0.001 * i, "train/loss": -0.1} for i in (1, 2, 3)]
    written = write_report(report, tmp_path, history=history)
    assert json.loads(written["report"].read_text()) == json.loads(json.dumps(report))
    metrics = json.loads(written["metrics"].read_text())
    assert metrics == headline_metrics(report) and metrics["train/final_win_rate"] == pytest.approx(2 / 3, abs=1e-6)
    markdown = written["markdown"].read_text()
    assert "| A | 2 | 0.00 | 1.00 | +1.00 [+1.00, +1.00] |" in markdown  # start, now, gain [CI]
    for name in ("success_by_episode", "learning_curves", "gains"):
        assert written[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "adaptation" not in written  # no memoryless or adaptive ceilings in this manifest
    assert to_markdown(report).startswith("# Evaluation report: ckpt-00003")


#: A run's metrics.jsonl by hand: seven iterations, their invalid-reply rates and KL.
INVALID = [0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.05]
KL = [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007]
HISTORY = [{"iteration": i + 1, "rollout/all/final_win_rate": 0.1 * i, "rollout/A/final_win_rate": 0.2 * i,
            "rollout/all/final_mean_return": i, "rollout/all/first_mean_return": -i,
            "rollout/invalid_rate": INVALID[i], "train/kl": KL[i], "train/loss": -0.1} for i in range(7)]


def test_the_report_says_the_training_rollouts_numbers_in_words(tmp_path):
    """Beside the figures: the training rollouts' invalid replies and KL over the last five
    iterations (3 to 7), and at the first, at the training temperature; the evaluation's
    temperature for the rest."""
    report = build_report({"train": TABLE}, MANIFEST, {"checkpoint": "c", "sampling": {"temperature": 0.6}}, 3,
                          history=list(reversed(HISTORY)), training_temperature=1.0)
    training = report["training"]
    # by hand: (0.3 + 0.2 + 0.1 + 0.05 + 0.05) / 5 and (3 + 4 + 5 + 6 + 7) / 5 thousandths
    assert (training["invalid_rate"], training["kl"]) == pytest.approx((0.14, 0.005))
    assert (training["invalid_rate_first"], training["window"], training["temperature"]) == (0.5, [3, 7], 1.0)
    number = r"([0-9.e-]+)"
    said = re.search(rf"Training rollouts \(temperature {number}\): invalid replies {number} over iterations "
                     rf"(\d+)-(\d+), the last (\d+) \({number} at iteration (\d+)\), KL to the reference {number} "
                     "over the same iterations", training["sentence"])
    assert said, training["sentence"]
    assert [float(x) for x in said.groups()] == pytest.approx([1.0, 0.14, 3, 7, 5, 0.5, 1, 0.005])
    assert "training sampling" in training["sentence"]
    markdown = to_markdown(report)
    assert training["sentence"] in markdown
    assert "Evaluation figures (the tables below, success_by_episode.png, gains.png): the evaluation sampling " \
           "(temperature 0.6)." in markdown
    written = write_report(report, tmp_path, history=HISTORY)
    assert written["learning_curves"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one iteration: the first is the last
    single = build_report({"train": TABLE}, MANIFEST, {}, 3, history=HISTORY[:1], training_temperature=0.8)["training"]
    assert "(temperature 0.8): invalid replies 0.5 over iteration 1, the last (0.5 at iteration 1), " \
           "KL to the reference 0.001 " in single["sentence"]
    # no training at all (the starting policy's report) says so
    assert build_report({"train": TABLE}, MANIFEST, {}, 3)["training"]["iterations"] == 0


def tick_labels(axis) -> list[str]:
    return [t.get_text().replace("\u2212", "-") for t in axis.get_ticklabels() if t.get_text()]


def test_plots_number_iterations_and_episodes_with_whole_numbers():
    """Three iterations and three episodes: matplotlib's default ticks would be 1.0, 1.5, ...,
    2.5; every plot the report draws labels them 1, 2, 3. The learning curves carry the
    training sentence under them, the evaluation figures their sampling."""
    from mage.report.plots import learning_curves_figure, success_by_episode_figure

    report = build_report({"train": TABLE}, MANIFEST, {"sampling": {"temperature": 0.6}}, 3,
                          start_tables={"train": start_of(TABLE)}, history=HISTORY[:3], training_temperature=1.0)
    curves = learning_curves_figure(HISTORY[:3], report["training"])
    success = success_by_episode_figure(report)
    try:
        for figure in (curves, success):
            figure.canvas.draw()
            for ax in figure.axes:
                labels = tick_labels(ax.xaxis)
                assert labels and all(re.fullmatch(r"-?\d+", label) for label in labels), labels
        notes = [t.get_text() for t in curves.texts if t.get_text() != curves.get_suptitle()]
        assert " ".join(" ".join(note.split()) for note in notes) == report["training"]["sentence"]
        assert curves.get_suptitle() == "training rollouts, at the training sampling (temperature 1)"
        assert [t.get_text() for t in success.texts] == [
            "Evaluation at the evaluation sampling (temperature 0.6), not the training rollouts' sampling."]
    finally:
        import matplotlib.pyplot as plt

        plt.close(curves)
        plt.close(success)


def test_wilson_agrees_with_scipy_and_the_bootstrap_covers_the_mean():
    import numpy as np

    from mage.report.intervals import group_bootstrap, wilson

    for successes, trials in ((0, 10), (3, 10), (10, 10), (192, 384)):
        assert list(wilson(successes, trials)) == pytest.approx(wilson_by_scipy(successes, trials))
    assert wilson(0, 0) is None
    # Two groups, one value each: resampled means are 0, 0.5 or 1, so the 95% interval spans [0, 1].
    assert group_bootstrap([0.0, 1.0], [1, 1]) == (0.0, 1.0)
    assert group_bootstrap([3.0], [2]) == (1.5, 1.5)
    # Coverage: intervals of the mean of 60 draws from N(1, 1) cover 1 about 95% of the time.
    rng = np.random.default_rng(7)
    covered = sum(low <= 1.0 <= high for low, high in
                  (group_bootstrap(rng.normal(1.0, 1.0, 60), np.ones(60), resamples=500, seed=s) for s in range(200)))
    assert 0.88 <= covered / 200 <= 0.99


#: Twelve meta-episodes against B, one group each: the final episode's return of meta-episode
#: m (wins when positive), after a first episode lost at -5.
FINAL_RETURNS = [float((m * 7) % 11 - 5) for m in range(12)]


def _many_groups_table():
    rows = []
    for meta, final in enumerate(FINAL_RETURNS):
        rows += [row(meta, "B", meta % 2, [Q, K], 1, 1, ret=-5, won=False),
                 row(meta, "B", meta % 2, [Q, K], 2, 1, ret=final, won=final > 0)]
    return rows


@settings(max_examples=15, deadline=None)
@given(order=st.permutations(range(24)))
def test_report_intervals_follow_from_the_groups_not_from_the_row_order(order):
    """The bootstrap is seeded, and resamples groups by position: the groups go in (opponent,
    group) order, so a table's intervals are the same however its rows are ordered (polars'
    group_by order alone once changed them between runs) and equal the interval over the
    groups taken by hand."""
    import numpy as np

    from mage.report.intervals import group_bootstrap

    rows = _many_groups_table()
    report = build_report({"train": from_rows([rows[i] for i in order])}, MANIFEST, {"checkpoint": "c"}, episodes=2)
    pooled = next(r for r in report["splits"]["train"]["opponents"] if r["opponent"] == "all")
    finals = FINAL_RETURNS  # group 0, 1, ... 11
    assert pooled["final_mean_return_ci"] == list(group_bootstrap(finals, np.ones(12)))
    assert pooled["return_gain_ci"] == list(group_bootstrap([f + 5 for f in finals], np.ones(12)))
    wins = [float(f > 0) for f in finals]
    assert pooled["win_rate_gain_ci"] == list(group_bootstrap(wins, np.ones(12)))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
NAMED = st.tuples(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8)) | st.just((None, None))
SAMPLING = st.dictionaries(st.text(max_size=8), st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                           | st.text(max_size=8) | st.lists(st.text(max_size=4), max_size=3), max_size=6)
WHOLE = st.builds(lambda named, iteration, sampling: {"checkpoint": named[0], "checkpoint_sha256": named[1],
                                                      "iteration": iteration, "sampling": sampling},
                  NAMED, st.integers(0, 10**6), SAMPLING)
#: Each makes a whole record one that cannot be right.
DEFECTS = {
    "a key missing": lambda r: {k: v for k, v in r.items() if k != "iteration"},
    "an empty checkpoint path": lambda r: r | {"checkpoint": "", "checkpoint_sha256": "ab"},
    "a path without its hash": lambda r: r | {"checkpoint": "c/ckpt-00001", "checkpoint_sha256": None},
    "a negative iteration": lambda r: r | {"iteration": -1},
    "a boolean iteration": lambda r: r | {"iteration": True},
    "a fractional iteration": lambda r: r | {"iteration": 1.5},
    "a nested sampling value": lambda r: r | {"sampling": {"temperature": {"value": 0.7}}},
    "sampling as a list": lambda r: r | {"sampling": [0.7]},
    "a numeric checkpoint": lambda r: r | {"checkpoint": 5, "checkpoint_sha256": "ab"},
    "an empty hash": lambda r: r | {"checkpoint": "c/ckpt-00001", "checkpoint_sha256": ""},
    "a number among the stop strings": lambda r: r | {"sampling": {"stop": ["</action>", 1]}},
    "a lone surrogate in the path": lambda r: r | {"checkpoint": "c/\ud800", "checkpoint_sha256": "ab"},
}


def read_back(directory, content) -> dict | None:
    from mage.evaluation.play import recorded_policy

    metrics = directory / "train-metrics.json"
    metrics.write_bytes(content) if isinstance(content, bytes) else metrics.write_text(json.dumps(content))
    return recorded_policy({"train": directory / "train.parquet"})


@settings(max_examples=200, deadline=None)
@given(record=WHOLE, defect=st.none() | st.sampled_from(sorted(DEFECTS)))
def test_a_whole_policy_record_is_read_back_and_a_broken_one_is_none(tmp_path_factory, record, defect):
    directory = tmp_path_factory.mktemp("tables")
    if defect is None:
        assert read_back(directory, {"policy": record, "final": []}) == record
    else:
        assert read_back(directory, {"policy": DEFECTS[defect](record)}) is None


@settings(max_examples=200, deadline=None)
@given(content=st.one_of(JSON, st.fixed_dictionaries({"policy": JSON}), st.binary(max_size=16)))
def test_whatever_a_metrics_file_holds_the_record_reader_does_not_raise(tmp_path_factory, content):
    """``{split}-metrics.json`` is read back from disk: a record comes back whole or not at all."""
    from mage.evaluation.play import RECORD_KEYS
    from mage.run.evaluation import Policy

    record = read_back(tmp_path_factory.mktemp("tables"), content)
    if record is not None:
        assert RECORD_KEYS <= record.keys() and record == content["policy"]
        checkpoint = Policy.recorded(record)
        assert checkpoint is None or (checkpoint.path, checkpoint.sha256) == (record["checkpoint"],
                                                                               record["checkpoint_sha256"])


def test_whole_policy_records_are_read_back_and_a_mixed_directory_is_refused(tmp_path):
    from mage.evaluation.play import recorded_policy
    from mage.io import IncompatibleFilesError

    sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 64}
    records = {"train": {"checkpoint": "c/ckpt-00001", "checkpoint_sha256": "ab", "iteration": 1, "sampling": sampling},
               "held_out": {"checkpoint": None, "checkpoint_sha256": None, "iteration": 0, "sampling": sampling}}
    refs = {split: str(tmp_path / f"{split}.parquet") for split in records}
    for split, record in records.items():
        (tmp_path / f"{split}-metrics.json").write_text(json.dumps({"policy": record, "final": []}))
    assert recorded_policy({"train": refs["train"]}) == records["train"]
    # one checkpoint named by two paths (./artifacts/... and absolutely) is one policy
    renamed = records["train"] | {"checkpoint": "/x/c/ckpt-00001"}
    (tmp_path / "held_out-metrics.json").write_text(json.dumps({"policy": renamed}))
    assert recorded_policy(refs)["checkpoint_sha256"] == "ab"
    (tmp_path / "held_out-metrics.json").write_text(json.dumps({"policy": records["held_out"], "final": []}))
    assert recorded_policy({"held_out": refs["held_out"]}) == records["held_out"]
    with pytest.raises(IncompatibleFilesError, match="different policies"):
        recorded_policy(refs)
    (tmp_path / "held_out-metrics.json").write_text(json.dumps({"final": []}))
    assert recorded_policy(refs) is None  # one table without a record: none for the directory


@pytest.mark.parametrize("content", [
    "1" * 5000,                        # past Python's integer-string limit: a plain ValueError
    "[" * 100_000 + "]" * 100_000,     # deeper than the parser's recursion
    '{"policy": {"checkpoint": null, "checkpoint_sha256": null, "iteration": 0, "sampling": {"t": [[[1]]]}}}',
    '{"policy": {"checkpoint": "", "checkpoint_sha256": "", "iteration": 0, "sampling": {}}}',
])
def test_a_policy_record_that_cannot_be_right_is_no_record(tmp_path, content):
    from mage.evaluation.play import recorded_policy

    (tmp_path / "train-metrics.json").write_text(content)
    assert recorded_policy({"train": tmp_path / "train.parquet"}) is None
