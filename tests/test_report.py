"""The generalisation report against a table and a manifest worked by hand."""

from __future__ import annotations

import json

import pytest

from mage.report import build_report, headline_metrics, to_markdown, write_report
from mage.rollout.schema import from_rows

J, Q, K = 0, 1, 2


def row(meta, opponent, seat, cards, episode, turn, *, ret, won, phase="play", valid=True, done=True):
    initial = json.dumps({"game": "kuhn_poker", "seed": meta, "agent_seat": seat, "data": {"cards": cards}})
    return {
        "run_id": "eval", "iteration": 3, "group_id": meta, "meta_id": meta, "game": "kuhn_poker", "opponent": opponent,
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


def test_per_opponent_summary_by_hand():
    report = build_report({"train": TABLE}, MANIFEST, {"checkpoint": "ckpt-00003"})
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
    assert b["max_win_probability"] == 0.4 and b["final_win_vs_ceiling"] == 0.0
    assert b["final_return_vs_ceiling"] is None  # a ratio to a negative ceiling says nothing
    assert pooled["meta_episodes"] == 3 and pooled["final_win_rate"] == pytest.approx(2 / 3)
    assert pooled["max_win_probability"] == pytest.approx((1.0 + 1.0 + 0.4) / 3)


def test_per_episode_table_by_hand():
    report = build_report({"train": TABLE}, MANIFEST, {})
    episodes = {(r["opponent"], r["episode"]): r for r in report["splits"]["train"]["episodes"]}
    # A: episode 1 played by both (0 wins), episode 2 by both (meta 0 wins), episode 3 by meta 1 only (wins)
    assert [episodes[("A", k)]["played"] for k in (1, 2, 3)] == [2, 2, 1]
    assert [episodes[("A", k)]["win_rate"] for k in (1, 2, 3)] == [0.0, 0.5, 1.0]
    assert [episodes[("A", k)]["pass_at_k"] for k in (1, 2, 3)] == [0.0, 0.5, 1.0]
    assert [episodes[("A", k)]["mean_return"] for k in (1, 2, 3)] == pytest.approx([-7.5, 0.0, 10.0])
    assert episodes[("A", 1)]["invalid_rate"] == pytest.approx(1 / 3)
    assert episodes[("A", 2)]["pass_at_k_vs_ceiling"] == 0.5
    assert episodes[("all", 3)]["pass_at_k"] == pytest.approx(2 / 3)


def test_no_return_ratio_to_a_near_zero_ceiling():
    # Against an equilibrium opponent a best response earns about the game's value (0 over both
    # Kuhn seats): -10 / 0.01 = -1000 would say nothing, so the ratio is null below 0.1.
    near_zero = {"opponents": [MANIFEST["opponents"][0], {"id": "B", "split": "train", "ceilings": {
        "seat_0": seat(0.4, 0.01), "seat_1": seat(0.6, 0.01)}}]}
    rows = {r["opponent"]: r for r in build_report({"train": TABLE}, near_zero, {})["splits"]["train"]["opponents"]}
    assert rows["B"]["best_response_return"] == pytest.approx(0.01)
    assert rows["B"]["final_return_vs_ceiling"] is None
    assert rows["A"]["final_return_vs_ceiling"] == pytest.approx(5.0)


def test_written_report_files(tmp_path):
    report = build_report({"train": TABLE}, MANIFEST, {"checkpoint": "ckpt-00003"})
    history = [{"iteration": i, "rollout/all/final_win_rate": 0.1 * i, "rollout/A/final_win_rate": 0.2 * i,
                "rollout/all/final_mean_return": i, "rollout/all/first_mean_return": -i, "rollout/invalid_rate": 0.01,
                "train/kl": 0.001 * i, "train/loss": -0.1} for i in (1, 2, 3)]
    written = write_report(report, tmp_path, history=history)
    assert json.loads(written["report"].read_text()) == json.loads(json.dumps(report))
    metrics = json.loads(written["metrics"].read_text())
    assert metrics == headline_metrics(report) and metrics["train/A/final_win_rate"] == 1.0
    assert "| A | 2 | 0.00 | 1.00 | +1.00 |" in written["markdown"].read_text()
    for name in ("success_by_episode", "learning_curves"):
        assert written[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert to_markdown(report).startswith("# Evaluation report: ckpt-00003")
