"""Returns and advantages against tables worked by hand (docs/method.md, Rewards and returns, Advantages).

The batch (gamma_step 0.5, gamma_traj 0.25, invalid penalty 1, no length penalty):

group A = opponent A, seed 1, seat 0
  meta 0: episode 1: t1 invalid, t2 ends it with R1 = -5
          episode 2: reflection (valid), t1 wins with R2 = +5 (early stop)
  meta 1: episode 1: t1 wins with R1 = +5 (early stop)
group B = opponent B, same seed and seat (two opponents in one batch: separate groups)
  meta 2: episode 1: t1 loses, R1 = -10
          episode 2: reflection (invalid), t1 loses, R2 = -10

Every play call sees the same observation "s0" (same initial state; an invalid reply
changes nothing), so in each group all play calls share one global anchor.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import algo_config
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.algo import Penalties, add_advantages, add_returns
from mage.rollout.schema import from_rows


def row(meta, opponent, episode, turn, *, ret, phase="play", valid=True, done=False, observation="s0", tokens=2, seed=1):
    return {
        "run_id": "r", "iteration": 0, "policy_version": 0, "group_id": 0, "meta_id": meta, "game": "kuhn_poker", "opponent": opponent,
        "seat": 0, "seed": seed, "initial_state": "{}", "episode": episode, "turn": turn, "phase": phase,
        "observation": observation, "prompt": "", "response": "", "prompt_token_ids": [1],
        "response_token_ids": [7] * tokens, "response_logprobs": [0.0] * tokens, "finish_reason": "stop",
        "dropped_episodes": 0, "action": None, "valid": valid, "invalid_reason": None if valid else "x",
        "step_reward": ret if done else 0.0, "episode_return": ret, "won": ret > 0, "draw": False,
        "truncated": False, "done": done,
    }


TABLE = from_rows([
    row(0, "A", 1, 1, ret=-5, valid=False),
    row(0, "A", 1, 2, ret=-5, done=True),
    row(0, "A", 2, 0, ret=5, phase="reflect", observation="end of episode 1"),
    row(0, "A", 2, 1, ret=5, done=True),
    row(1, "A", 1, 1, ret=5, done=True),
    row(2, "B", 1, 1, ret=-10, done=True),
    row(2, "B", 2, 0, ret=-10, phase="reflect", valid=False, observation="end of episode 1"),
    row(2, "B", 2, 1, ret=-10, done=True),
]).sample(fraction=1.0, shuffle=True, seed=3)  # order must not matter

CFG = algo_config(gamma_step=0.5, gamma_traj=0.25)
PENALTIES = Penalties(invalid=1.0, length=0.0, max_response_tokens=256)


def column(table: pl.DataFrame, name: str) -> list[float]:
    return table.sort("meta_id", "episode", "turn")[name].to_list()


def test_differential_returns_by_hand():
    t = add_returns(TABLE, CFG, PENALTIES)
    # D1 = -5, D2 = 5 - (-5) = 10 | D1 = 5 | D1 = -10, D2 = -10 - (-10) = 0
    assert column(t, "meta_reward") == [-5, -5, 10, 10, 5, -10, 0, 0]
    assert column(t, "penalty") == [-1, 0, 0, 0, 0, 0, -1, 0]
    assert column(t, "reward") == [-1, -5, 0, 10, 5, -10, -1, 0]
    # meta 0: G(e2 t1) = 10; reflection takes it: 0 + 10; G(e1 t2) = -5 + 0.25 * 10 = -2.5;
    #         G(e1 t1) = -1 + 0.5 * -2.5 = -2.25.   meta 2: 0; -1 + 0; -10 + 0.25 * 0 = -10.
    assert column(t, "step_return") == pytest.approx([-2.25, -2.5, 10, 10, 5, -10, -1, 0])
    # telescoping: the differential rewards of a meta-episode sum to its last return
    sums = t.filter(pl.col("done")).group_by("meta_id").agg(pl.col("meta_reward").sum()).sort("meta_id")
    assert sums["meta_reward"].to_list() == [5, 5, -10]


def test_other_objectives():
    cumulative = add_returns(TABLE, algo_config(objective="cumulative", gamma_step=0.5, gamma_traj=0.25), PENALTIES)
    assert column(cumulative, "meta_reward") == [-5, -5, 5, 5, 5, -10, -10, -10]
    # G(e1 t2) = -5 + 0.25 * 5 = -3.75; G(e1 t1) = -1 + 0.5 * -3.75 = -2.875
    assert column(cumulative, "step_return")[:4] == pytest.approx([-2.875, -3.75, 5, 5])
    single = add_returns(TABLE, algo_config(objective="single_episode", gamma_step=0.5, gamma_traj=0.25), PENALTIES)
    # no credit crosses the boundary: G(e1 t2) = -5, G(e1 t1) = -1 + 0.5 * -5 = -3.5
    assert column(single, "step_return")[:4] == pytest.approx([-3.5, -5, 5, 5])


def test_length_penalty_by_hand():
    table = from_rows([row(0, "A", 1, t + 1, ret=0, tokens=n, done=(t == 3)) for t, n in enumerate([3, 4, 6, 10])])
    t = add_returns(table, algo_config(), Penalties(invalid=0.0, length=2.0, max_response_tokens=8))
    # half = 4: 3 and 4 tokens are free; 6 -> -2 * 2/4 = -1; 10 -> -2 * min(1, 6/4) = -2
    assert column(t, "penalty") == [0, 0, -1, -2]


def test_gigpo_advantages_global_anchor_by_hand():
    t = add_advantages(add_returns(TABLE, CFG, PENALTIES), CFG)
    # episode scores s = D + penalty: A: -6, -5, 10, 10, 5 (mean 2.8); B: -10, -1, 0 (mean -11/3)
    assert column(t, "episode_score") == [-6, -5, 10, 10, 5, -10, -1, 0]
    assert column(t, "advantage_episode") == pytest.approx([-8.8, -7.8, 7.2, 7.2, 2.2, -19 / 3, 8 / 3, 11 / 3])
    # A's play anchor "s0": G = -2.25, -2.5, 10, 5 (mean 2.5625); B's: -10, 0 (mean -5);
    # reflections are singleton anchors: 0
    assert column(t, "advantage_step") == pytest.approx([-4.8125, -5.0625, 0, 7.4375, 2.4375, -5, 0, 5])
    assert column(t, "advantage") == pytest.approx([-13.6125, -12.8625, 7.2, 14.6375, 4.6375, -34 / 3, 8 / 3, 26 / 3])


def test_negative_weight_scales_only_negative_advantages_by_hand():
    cfg = algo_config(gamma_step=0.5, gamma_traj=0.25, negative_weight=0.25)
    t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
    # the advantages of test_gigpo_advantages_global_anchor_by_hand, negatives times 0.25
    assert column(t, "advantage") == pytest.approx(
        [-13.6125 / 4, -12.8625 / 4, 7.2, 14.6375, 4.6375, -34 / 12, 8 / 3, 26 / 3])
    # its two terms are left as they were
    assert column(t, "advantage_episode") == pytest.approx([-8.8, -7.8, 7.2, 7.2, 2.2, -19 / 3, 8 / 3, 11 / 3])
    grpo = algo_config(gamma_step=0.5, gamma_traj=0.25, estimator="grpo",
                      norm="mean_std_norm", negative_weight=0.0)
    # test_grpo_baseline_by_hand's -1, -1, -1, -1, 1, 0, 0, 0 with the negatives at 0
    grpo_table = add_advantages(add_returns(TABLE, grpo, PENALTIES), grpo)
    assert column(grpo_table, "advantage") == pytest.approx([0, 0, 0, 0, 1, 0, 0, 0], abs=1e-5)
    assert column(grpo_table, "advantage_episode") == pytest.approx([-1, -1, -1, -1, 1, 0, 0, 0], abs=1e-5)


#: Random meta-episodes: an opponent, and per episode its return and whether its first call was invalid.
META_EPISODES = st.lists(st.tuples(st.sampled_from("AB"), st.lists(st.tuples(st.sampled_from([-10.0, 0.0, 10.0]),
                                                                             st.booleans()), min_size=1, max_size=3)),
                         min_size=1, max_size=8)


def meta_episode_rows(metas) -> list[dict]:
    """Two play calls an episode (the first valid or not, the second ending it), a reflection
    before every episode after the first."""
    rows = []
    for meta, (opponent, episodes) in enumerate(metas):
        for n, (ret, invalid) in enumerate(episodes, start=1):
            if n > 1:
                rows.append(row(meta, opponent, n, 0, ret=ret, phase="reflect", observation="end"))
            rows.append(row(meta, opponent, n, 1, ret=ret, valid=not invalid))
            rows.append(row(meta, opponent, n, 2, ret=ret, done=True, observation="s1"))
    return rows


@given(META_EPISODES, st.sampled_from([0.0, 0.25]), st.sampled_from([0.5, 1.0]))
@settings(max_examples=60, deadline=None)
def test_negative_weight_scales_the_sum_of_the_two_terms(metas, negative_weight, step_weight):
    """The weight applies to A_ep + w * A_step, not to each term: where the terms have opposite
    signs the two readings differ. The terms themselves are those of negative_weight 1."""
    rows = meta_episode_rows(metas)
    plain_cfg = algo_config(step_weight=step_weight)
    weighted_cfg = algo_config(step_weight=step_weight,
                              negative_weight=negative_weight)
    order = ["meta_id", "episode", "turn"]
    plain = add_advantages(add_returns(from_rows(rows), plain_cfg, PENALTIES), plain_cfg).sort(order)
    weighted = add_advantages(add_returns(from_rows(rows), weighted_cfg, PENALTIES), weighted_cfg).sort(order)
    assert weighted["advantage_episode"].to_list() == plain["advantage_episode"].to_list()
    assert weighted["advantage_step"].to_list() == plain["advantage_step"].to_list()
    expected = []
    for episode_term, step_term in zip(plain["advantage_episode"], plain["advantage_step"]):
        total = episode_term + step_weight * step_term
        expected.append(total * negative_weight if total < 0 else total)
    assert weighted["advantage"].to_list() == pytest.approx(expected, abs=1e-9)


def test_local_anchor_and_step_weight():
    cfg = algo_config(gamma_step=0.5, gamma_traj=0.25, anchor="local", step_weight=0.5)
    t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
    # A, episode 1 anchor: G = -2.25, -2.5, 5 (mean 1/12); A episode 2 and B's anchors: singletons
    first = 0.25 / 3
    assert column(t, "advantage_step") == pytest.approx([-2.25 - first, -2.5 - first, 0, 0, 5 - first, 0, 0, 0])
    assert column(t, "advantage")[0] == pytest.approx(-8.8 + 0.5 * (-2.25 - first))


def test_mixed_grouping_pools_the_opponents_of_a_state_by_hand():
    cfg = algo_config(gamma_step=0.5, gamma_traj=0.25, grouping="mixed")
    t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
    # A and B share seed and seat: one group. s = -6, -5, 10, 10, 5, -10, -1, 0 (mean 3/8)
    assert column(t, "advantage_episode") == pytest.approx([s - 3 / 8 for s in [-6, -5, 10, 10, 5, -10, -1, 0]])
    # play anchor "s0" across both opponents: G = -2.25, -2.5, 10, 5, -10, 0 (mean 1/24);
    # the two reflections now share the group's reflection anchor: G = 10, -1 (mean 4.5)
    m = 1 / 24
    assert column(t, "advantage_step") == pytest.approx([-2.25 - m, -2.5 - m, 5.5, 10 - m, 5 - m, -10 - m, -5.5, -m])


def test_mean_std_norm_and_per_opponent_scope():
    # A second group against opponent A (seed 2): with scope "opponent" both A groups share
    # one mean and std, with scope "group" each has its own.
    extra = from_rows([row(3, "A", 1, 1, ret=-5, done=True, seed=2), row(4, "A", 1, 1, ret=5, done=True, seed=2)])
    table = pl.concat([TABLE, extra])
    group = algo_config(gamma_step=0.5, gamma_traj=0.25, norm="mean_std_norm")
    by_group = add_advantages(add_returns(table, group, PENALTIES), group)
    # seed-2 group: s = -5, 5: mean 0, std 5 -> -1, +1
    assert column(by_group, "advantage_episode")[-2:] == pytest.approx([-1, 1], abs=1e-5)
    scope = algo_config(gamma_step=0.5, gamma_traj=0.25, norm="mean_std_norm", norm_scope="opponent")
    by_opponent = add_advantages(add_returns(table, scope, PENALTIES), scope)
    scores_a = [-6, -5, 10, 10, 5, -5, 5]
    mean = sum(scores_a) / 7
    std = (sum((s - mean) ** 2 for s in scores_a) / 7) ** 0.5
    expected = [(s - mean) / (std + 1e-6) for s in scores_a]
    got = by_opponent.filter(pl.col("opponent") == "A").sort("meta_id", "episode", "turn")["advantage_episode"].to_list()
    assert got == pytest.approx(expected)


def test_per_episode_baseline_by_hand():
    cfg = algo_config(gamma_step=0.5, gamma_traj=0.25, episode_baseline="per_episode")
    t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
    # s = D + penalty as above. A, episode 1: -6, -5, 5 (mean -2); A, episode 2: 10, 10 (mean 10);
    # B, episode 1: -10 alone; B, episode 2: -1, 0 (mean -0.5). The pooled baseline put every
    # call of A's episode 1 below A's mean of 2.8; here none of A's episodes has a sign.
    assert column(t, "advantage_episode") == pytest.approx([-4, -3, 0, 0, 7, 0, -0.5, 0.5])
    # the step term does not depend on it
    assert column(t, "advantage_step") == pytest.approx([-4.8125, -5.0625, 0, 7.4375, 2.4375, -5, 0, 5])


@given(META_EPISODES, st.sampled_from(["mean_norm", "mean_std_norm"]))
@settings(max_examples=60, deadline=None)
def test_per_episode_baseline_against_a_second_implementation(metas, norm):
    """Random meta-episodes (opponent; per episode its return and whether its first call was
    invalid): the episode term equals (s - mean) [/ (std + eps)] over the calls of the same
    group and episode number, computed here with plain Python."""
    rows = meta_episode_rows(metas)
    cfg = algo_config(norm=norm, episode_baseline="per_episode")
    t = add_advantages(add_returns(from_rows(rows), cfg, PENALTIES), cfg).sort("meta_id", "episode", "turn")
    cells: dict[tuple, list[float]] = {}
    for r in t.iter_rows(named=True):
        cells.setdefault((r["opponent"], r["episode"]), []).append(r["episode_score"])
    expected = []
    for r in t.iter_rows(named=True):
        scores = cells[(r["opponent"], r["episode"])]
        mean = sum(scores) / len(scores)
        centred = r["episode_score"] - mean
        if norm == "mean_std_norm":
            centred /= (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5 + 1e-6
        expected.append(centred)
    assert t["advantage_episode"].to_list() == pytest.approx(expected, abs=1e-6)


def test_grpo_baseline_by_hand():
    cfg = algo_config(gamma_step=0.5, gamma_traj=0.25, estimator="grpo", norm="mean_std_norm")
    t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
    # summed rewards: meta 0: -1 - 5 + 0 + 10 = 4, meta 1: 5 (mean 4.5, std 0.5); meta 2 alone
    assert column(t, "episode_score")[:5] == [4, 4, 4, 4, 5]
    assert column(t, "advantage") == pytest.approx([-1, -1, -1, -1, 1, 0, 0, 0], abs=1e-5)
    assert set(column(t, "advantage_step")) == {0.0}


def test_advantages_need_returns_first():
    with pytest.raises(ValueError, match="add_returns"):
        add_advantages(TABLE, CFG)


@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0.0, 10.0])), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_meta_rewards_coincide_when_only_an_early_stopping_win_pays(metas):
    """Sokoban's case (docs/results.md, "The paper's table at laptop scale"): a failed episode
    returns 0 and a solved one ends the meta-episode, so D_n = R_n - R_{n-1} equals R_n for every
    episode, and MAGE and LaMer are one algorithm there. A loss that pays (Kuhn, Tic-Tac-Toe)
    separates them."""
    from mage.algo.returns import meta_rewards

    rows = [{"run_id": "r", "iteration": 1, "policy_version": 0, "meta_id": meta, "episode": n,
             "episode_return": last if n == episodes else 0.0}
            for meta, (episodes, last) in enumerate(metas) for n in range(1, episodes + 1)]
    table = pl.DataFrame(rows)
    differential, cumulative = meta_rewards(table, "differential"), meta_rewards(table, "cumulative")
    assert differential.equals(cumulative)
    paying = table.with_columns(pl.when(pl.col("episode") == 1).then(-1.0).otherwise(pl.col("episode_return"))
                                .alias("episode_return"))
    if any(episodes > 1 for episodes, _ in metas):  # a paid loss before a later episode
        assert not meta_rewards(paying, "differential").equals(meta_rewards(paying, "cumulative"))


def test_a_new_estimator_or_objective_is_one_function_and_one_registration():
    """As verl's core_algos: a function registered by name, then selectable from params/."""
    from mage.algo import ESTIMATORS, OBJECTIVES, register_estimator, register_objective
    from mage.settings import load_settings

    @register_estimator("no_step_term")
    def no_step_term(table, cfg, group, scope):  # GiGPO's episode term alone
        return ESTIMATORS["gigpo"](table, cfg, group, scope).with_columns(pl.lit(0.0).alias("advantage_step"))

    @register_objective("final_only", crosses_episodes=False)
    def final_only():  # the episode's return on the last episode only
        last = pl.col("episode") == pl.col("episode").max().over(["run_id", "iteration", "meta_id"])
        return pl.when(last).then(pl.col("episode_return")).otherwise(0.0)

    try:
        cfg = load_settings(["algo.estimator=no_step_term", "algo.objective=final_only"]).algo
        t = add_advantages(add_returns(TABLE, cfg, PENALTIES), cfg)
        assert column(t, "meta_reward") == [0, 0, 5, 5, 5, 0, -10, -10]
        assert set(column(t, "advantage_step")) == {0.0}
        assert column(t, "advantage") == column(t, "advantage_episode")
        with pytest.raises(ValueError, match="registered twice"):
            register_estimator("gigpo")(no_step_term)
    finally:
        ESTIMATORS.pop("no_step_term", None)
        OBJECTIVES.pop("final_only", None)
