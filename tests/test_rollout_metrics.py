"""Metrics from a trajectory table, against a table worked by hand."""

from __future__ import annotations

import pytest

from mage.rollout import rollout_metrics
from mage.rollout.schema import from_rows


def row(meta, opponent, episode, turn, *, phase="play", valid=True, ret=0.0, won=False, draw=False, tokens=3):
    return {
        "run_id": "r", "iteration": 0, "policy_version": 0, "group_id": meta, "meta_id": meta, "game": "kuhn_poker",
        "opponent": opponent, "seat": 0, "seed": 0, "initial_state": "{}", "episode": episode, "turn": turn,
        "phase": phase, "observation": "", "prompt": "", "response": "x",
        "prompt_token_ids": [1], "response_token_ids": list(range(tokens)), "response_logprobs": [0.0] * tokens,
        "finish_reason": "stop", "dropped_episodes": 0, "action": None, "valid": valid, "invalid_reason": None,
        "step_reward": 0.0, "episode_return": ret, "won": won, "draw": draw, "truncated": False, "done": False,
    }


# opponent A, meta 0: loses episode 1 (one invalid call), reflects validly, wins episode 2 (early stop)
# opponent A, meta 1: wins episode 1
# opponent B, meta 2: draw, loss, loss; one invalid reflection
TABLE = from_rows([
    row(0, "A", 1, 1, valid=False, ret=-5), row(0, "A", 1, 2, ret=-5, tokens=5),
    row(0, "A", 2, 0, phase="reflect", ret=5, won=True), row(0, "A", 2, 1, ret=5, won=True),
    row(1, "A", 1, 1, ret=10, won=True),
    row(2, "B", 1, 1, ret=0, draw=True),
    row(2, "B", 2, 0, phase="reflect", valid=False, ret=-10), row(2, "B", 2, 1, ret=-10),
    row(2, "B", 3, 0, phase="reflect", ret=-5), row(2, "B", 3, 1, ret=-5),
])


def metric(table, opponent, episode, name):
    return table.filter((table["opponent"] == opponent) & (table["episode"] == episode))[name].item()


def test_metrics_by_hand():
    m = rollout_metrics(TABLE)
    # A, episode 1: both meta-episodes played; one win; returns -5 and 10
    assert metric(m, "A", 1, "played") == 2 and metric(m, "A", 1, "win_rate") == 0.5
    assert metric(m, "A", 1, "mean_return") == pytest.approx(2.5)
    assert metric(m, "A", 1, "pass_at_k") == 0.5
    assert metric(m, "A", 1, "invalid_rate") == pytest.approx(1 / 3)  # 1 invalid of 3 play calls
    assert metric(m, "A", 1, "mean_response_tokens") == pytest.approx((3 + 5 + 3) / 3)
    assert metric(m, "A", 1, "reflection_validity") is None
    # A, episode 2: only meta 0 played it (meta 1 stopped early); pass@2 counts both
    assert metric(m, "A", 2, "played") == 1 and metric(m, "A", 2, "win_rate") == 1.0
    assert metric(m, "A", 2, "pass_at_k") == 1.0 and metric(m, "A", 2, "reflection_validity") == 1.0
    # B: draw then two losses
    assert metric(m, "B", 1, "draw_rate") == 1.0 and metric(m, "B", 1, "win_rate") == 0.0
    assert metric(m, "B", 3, "pass_at_k") == 0.0 and metric(m, "B", 3, "mean_return") == -5.0
    assert metric(m, "B", 2, "reflection_validity") == 0.0
    # pooled: episode 1 played by all 3 meta-episodes, 1 win; pass@3 = 2 of 3
    assert metric(m, "all", 1, "played") == 3 and metric(m, "all", 1, "win_rate") == pytest.approx(1 / 3)
    assert metric(m, "all", 3, "pass_at_k") == pytest.approx(2 / 3)
    assert metric(m, "all", 1, "mean_return") == pytest.approx((-5 + 10 + 0) / 3)
    assert m["opponent"].to_list()[-1] == "all"


def test_empty_table_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        rollout_metrics(TABLE.clear())
