"""Rollouts behind the update (``train.max_staleness``): the decoupled loss against a hand
computation, staleness 0 as the loss and the loop were, the settings' refusals, and the loop at
staleness 1: which weights each rollout samples from, the correction's metrics, and a stopped
run resumed to what an uninterrupted one leaves."""

from __future__ import annotations

import dataclasses
import math

import polars as pl
import pytest
import torch
from conftest import algo_config
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.algo.losses import POLICY_LOSSES, behaviour_weights, decoupled_ppo_loss, ppo_loss
from mage.config.sections import PolicyLossName
from mage.settings import SettingsError, load_settings

# one row of three reply tokens and one of two (its third position padding)
LOGPROBS = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
OLD = torch.tensor([[-1.1, -0.4, -2.0], [-0.2, -1.0, 0.0]])
BEHAVIOUR = torch.tensor([[-1.5, -0.4, -3.0], [-0.9, -0.1, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADVANTAGES = torch.tensor([0.5, -1.0])


def test_the_registered_losses_are_the_ones_the_settings_name():
    assert set(POLICY_LOSSES) == set(PolicyLossName.__args__)
    assert POLICY_LOSSES["ppo"] is ppo_loss and POLICY_LOSSES["decoupled_ppo"] is decoupled_ppo_loss


def hand_loss(stale_rows: set[int], cap: float, cfg) -> tuple[float, list[float]]:
    """The decoupled loss worked out token by token in floats (no KL or entropy term), and the weights."""
    total, weights, tokens = 0.0, [], 5
    for row in range(2):
        advantage = float(ADVANTAGES[row])
        for t in range(3):
            if not MASK[row, t]:
                continue
            ratio = math.exp(float(LOGPROBS[row, t]) - float(OLD[row, t]))
            clipped = min(max(ratio, 1 - cfg.clip_ratio), 1 + cfg.clip_ratio)
            pg = max(-advantage * ratio, -advantage * clipped)
            if advantage < 0:
                pg = min(pg, -advantage * cfg.dual_clip)
            weight = min(math.exp(float(OLD[row, t]) - float(BEHAVIOUR[row, t])), cap) if row in stale_rows else 1.0
            weights.append(weight)
            total += weight * pg
    return total / tokens, weights


@pytest.mark.parametrize("stale_rows", [{0}, {1}, {0, 1}])
def test_the_decoupled_loss_weighs_stale_rows_as_worked_out_by_hand(stale_rows):
    cfg = algo_config(kl_coef=0.0, entropy_coef=0.0, behaviour_weight_cap=2.0)
    stale = torch.tensor([row in stale_rows for row in range(2)])
    parts = decoupled_ppo_loss(LOGPROBS, OLD, None, ADVANTAGES, MASK, cfg, 5, None,
                               behaviour_logprobs=BEHAVIOUR, stale=stale)
    expected, weights = hand_loss(stale_rows, 2.0, cfg)
    assert float(parts.loss) == pytest.approx(expected, rel=1e-6)
    # row 0's first token: exp(-1.1 + 1.5) = 1.49; its third: exp(1.0) = 2.72, cut to 2; row 1: exp(0.7) = 2.01, cut
    raw = [math.exp(float(OLD[r, t]) - float(BEHAVIOUR[r, t])) for r in range(2) for t in range(3) if MASK[r, t]]
    truncated = sum(1 for (r, _), w in zip([(r, t) for r in range(2) for t in range(3) if MASK[r, t]], raw)
                    if r in stale_rows and w > 2.0)
    w = parts.weights
    positions = [(r, t) for r in range(2) for t in range(3) if MASK[r, t]]
    stale_weights = [x for (r, _), x in zip(positions, weights) if r in stale_rows]
    stale_raw = [x for (r, _), x in zip(positions, raw) if r in stale_rows]
    assert w.tokens == 5 and w.stale == len(stale_weights) == sum(3 if r == 0 else 2 for r in stale_rows)
    assert w.truncated == truncated and truncated >= 1
    assert w.total == pytest.approx(sum(stale_weights), rel=1e-6)
    assert w.squares == pytest.approx(sum(x * x for x in stale_weights), rel=1e-6)
    assert w.largest == pytest.approx(max(stale_raw), rel=1e-6)


def gradient(loss, stale, **cfg_changes) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = LOGPROBS.detach().clone().requires_grad_(True)
    ref = OLD - 0.3
    entropy = torch.tensor([[0.7, 0.2, 0.4], [1.1, 0.3, 0.0]])
    parts = loss(logprobs, OLD, ref, ADVANTAGES, MASK, algo_config(**cfg_changes), 5, entropy,
                 behaviour_logprobs=BEHAVIOUR, stale=torch.tensor(stale))
    parts.loss.backward()
    return parts.loss.detach(), logprobs.grad


def test_a_fresh_row_is_trained_as_ppo_trains_it_bit_for_bit_and_a_stale_one_is_weighted():
    # no stale row: the same loss and gradient, bit for bit (the KL and entropy terms included)
    assert all(torch.equal(a, b) for a, b in zip(gradient(ppo_loss, [False, False]),
                                                  gradient(decoupled_ppo_loss, [False, False])))
    # row 0 stale, row 1 fresh: row 1's gradient is ppo's bit for bit, row 0's policy gradient
    # is ppo's times its weights (no KL or entropy term here to keep apart)
    plain = {"kl_coef": 0.0, "entropy_coef": 0.0}
    _, ppo = gradient(ppo_loss, [True, False], **plain)
    _, decoupled = gradient(decoupled_ppo_loss, [True, False], **plain)
    assert torch.equal(decoupled[1], ppo[1])
    weights = torch.exp(OLD[0] - BEHAVIOUR[0]).clamp(max=2.0)
    assert decoupled[0].tolist() == pytest.approx((weights * ppo[0]).tolist(), rel=1e-6)
    assert not torch.equal(decoupled[0], ppo[0])
    # and the weights of fresh rows are exactly 1, whatever the behaviour log-probs say
    assert torch.equal(behaviour_weights(OLD, BEHAVIOUR, torch.tensor([False, False]), MASK), torch.ones_like(OLD))


def test_a_table_from_before_policy_version_reads_with_the_column_null(tmp_path):
    from mage.rollout.schema import BASE_SCHEMA, read_trajectories

    older = pl.DataFrame(schema={k: v for k, v in BASE_SCHEMA.items() if k != "policy_version"})
    older.write_parquet(tmp_path / "old.parquet")
    table = read_trajectories(tmp_path / "old.parquet")
    assert table.columns == list(BASE_SCHEMA) and table.schema["policy_version"] == pl.Int64


def test_a_stale_row_without_its_log_probs_is_refused():
    from mage.trainer.policy_trainer import stale_rows

    table = pl.DataFrame({"policy_version": [0, 1], "response_logprobs": [[-0.1], [-0.2, -0.3]]})
    stale, behaviour = stale_rows(table, 1, [1, 2])
    assert stale.tolist() == [True, False]
    assert behaviour[0].tolist() == pytest.approx([-0.1]) and behaviour[1].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="row 0 was sampled from an older policy"):
        stale_rows(table, 1, [2, 2])
    fresh, none = stale_rows(table.with_columns(policy_version=pl.lit(1)), 1, [1, 2])
    assert not fresh.any() and none is None


@settings(max_examples=30, deadline=None)
@given(staleness=st.integers(-3, 5))
def test_max_staleness_is_0_or_1_and_anything_else_is_refused_by_its_key(staleness):
    if staleness in (0, 1):
        assert load_settings([f"train.max_staleness={staleness}"]).train.max_staleness == staleness
    else:
        with pytest.raises(SettingsError, match="train.max_staleness"):
            load_settings([f"train.max_staleness={staleness}"])


@pytest.mark.parametrize(("override", "key"), [
    ("engine.sampling.temperature=0.7", "engine.sampling.temperature"),
    ("population.league.enabled=true", "population.league.enabled"),
    ("engine.backend=vllm", "train.max_staleness"),
    ("flow.runner=process", "train.max_staleness"),
])
def test_what_the_overlapped_loop_does_not_take_is_refused_before_any_work(override, key):
    with pytest.raises(SettingsError, match=key):
        load_settings(["train.max_staleness=1", *override.split()])
    load_settings(["train.max_staleness=0", *override.split()])  # as before at staleness 0


def small(model_dir, root, *extra: str):
    return load_settings([
        f"model.path={model_dir}", "model.build=null", "train.iterations=3", "train.learning_rate=1e-3",
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=6", "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6",
        f"paths.artifacts={root}", f"paths.results={root}/results", *extra,
    ])


@pytest.mark.e2e
def test_behind_the_update_each_rollout_samples_from_the_weights_before_it_and_a_resume_continues_exactly(
        tiny_model_dir, tmp_path):
    import json

    from mage.models import checkpoint as ckpt
    from mage.rollout import read_trajectories
    from mage.run import RunLayout, train

    extra = ("train.max_staleness=1", "train.iterations=4", "train.checkpoint_every=2")
    whole = small(tiny_model_dir, tmp_path / "whole", *extra)
    assert train(whole, progress=False).iterations == [1, 2, 3, 4]
    layout = RunLayout.of(whole)
    versions = {k: set(read_trajectories(layout.rollout(k))["policy_version"].to_list()) for k in (1, 2, 3, 4)}
    assert versions == {1: {0}, 2: {0}, 3: {1}, 4: {2}}  # iteration k+1 played during update k, from the weights before it
    metrics = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
    first = metrics[0]
    assert (first["train/stale_token_share"], first["train/behaviour_weight_mean"], first["train/behaviour_weight_std"],
            first["train/behaviour_weight_max"], first["train/behaviour_weight_truncated_share"]) == (0, 1, 0, 1, 0)
    for later in metrics[1:]:  # every row of iterations 2 to 4 is one update behind
        assert later["train/stale_token_share"] == 1 and later["train/behaviour_weight_std"] > 0
        assert later["train/behaviour_weight_max"] >= later["train/behaviour_weight_mean"] > 0
        assert 0 <= later["train/behaviour_weight_truncated_share"] <= 1
        assert "train/rollout_logprob_gap_max" not in later  # fresh rows only, and there are none
    # what was kept for a resume: iterations 3 and 4 (checkpoint 4 dropped those up to checkpoint 2)
    kept = sorted(p.name for p in (layout.rollouts / "shards").iterdir())
    assert kept == ["iteration-00003-shard-000.parquet", "iteration-00003-shard-000.stats.json",
                    "iteration-00004-shard-000.parquet", "iteration-00004-shard-000.stats.json"]
    from mage.run import steps

    assert steps.kept_ahead(whole, 4, policy_version=3) is None  # not what it was sampled from
    assert steps.kept_ahead(whole, 3, policy_version=1) is not None

    parts = small(tiny_model_dir, tmp_path / "parts", *extra)
    assert train(parts, progress=False, stop_after=3).iterations == [1, 2, 3]
    assert [c.iteration for c in ckpt.list_checkpoints(RunLayout.of(parts).checkpoints)] == [2]
    # resumed from checkpoint 2: iteration 3 again, on the table kept behind update 2, then 4
    assert train(parts, progress=False).iterations == [3, 4]
    resumed = RunLayout.of(parts)
    for k in (1, 2, 3, 4):
        assert read_trajectories(resumed.rollout(k)).equals(read_trajectories(layout.rollout(k)))
    assert resumed.metrics.read_bytes() == layout.metrics.read_bytes()
    for name in ("ckpt-00002", "ckpt-00004"):
        assert (resumed.checkpoints / name / "model.safetensors").read_bytes() == \
            (layout.checkpoints / name / "model.safetensors").read_bytes()


@pytest.mark.e2e
def test_at_staleness_0_every_rollout_samples_from_the_newest_weights_and_no_weight_is_recorded(tiny_model_dir, tmp_path):
    import json

    from mage.rollout import read_trajectories
    from mage.run import RunLayout, train

    plain = small(tiny_model_dir, tmp_path, "train.iterations=2")
    train(plain, progress=False)
    layout = RunLayout.of(plain)
    assert [set(read_trajectories(layout.rollout(k))["policy_version"].to_list()) for k in (1, 2)] == [{0}, {1}]
    assert not any("behaviour_weight" in key for line in layout.metrics.read_text().splitlines()
                   for key in json.loads(line))
    assert not (layout.rollouts / "shards").exists()


def test_the_settings_dataclass_takes_the_new_keys():
    cfg = algo_config()
    assert cfg.policy_loss == "decoupled_ppo" and cfg.behaviour_weight_cap > 1
    with pytest.raises(ValueError):
        dataclasses.replace(cfg, behaviour_weight_cap=1.0)


@pytest.mark.e2e
def test_a_failed_update_stops_the_rollout_behind_it_and_the_run_starts_again(tiny_model_dir, tmp_path, monkeypatch):
    import threading

    import mage.run.steps as steps
    from mage import stopping
    from mage.run import train

    settings_ = small(tiny_model_dir, tmp_path, "train.max_staleness=1", "train.iterations=2")
    real = steps.update

    def failing(state, table, iteration):
        raise RuntimeError("update failed")

    monkeypatch.setattr(steps, "update", failing)
    with pytest.raises(RuntimeError, match="update failed"):
        train(settings_, progress=False)
    assert not [t for t in threading.enumerate() if "behind" in t.name]  # no rollout left playing
    assert not stopping.requested()  # the ask that stopped it is withdrawn
    monkeypatch.setattr(steps, "update", real)
    assert train(settings_, progress=False).iterations == [1, 2]
