"""Weights into the running vLLM engine through memory, checked (mage/backends/vllm_sync.py), on
vLLM for real (its CPU build here). One engine for full weights serves the whole module (and the
training run at its end, which asks for the same engine); the LoRA test starts its own.

Every check is against the trainer's own teacher-forced log-probs of the same tokens
(PolicyTrainer.logprobs: transformers, a second implementation of the network), float32 on
both sides, to the engine's float32 tolerance per token (measured gaps are printed;
docs/notes/findings.md records them).
"""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch
from conftest import algo_config, rollout_config, sampling, train_config

from mage.algo import Penalties, add_advantages, add_returns
from mage.backends import weight_sync
from mage.backends.weight_sync import TOLERANCES
from mage.config.compose import compose
from mage.rollout import RolloutEngine, plan_meta_episodes
from mage.settings.entries import population_entries

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

#: The check's float32 default; an update must move the probe, and stale weights miss it, by
#: 100 times more.
TOLERANCE = TOLERANCES["float32"]


def overrides(model_dir, artifacts, *extra: str) -> list[str]:
    return [
        f"model.path={model_dir}", "model.build=null", "engine.backend=vllm", "engine.vllm.max_model_len=2048",
        "engine.vllm.enforce_eager=true", "train.iterations=2", "train.learning_rate=3e-3",
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=8", "eval.meta_episodes=4", "eval.sampling.max_new_tokens=8",
        f"paths.artifacts={artifacts}", f"paths.results={artifacts}/results", *extra,
    ]


@pytest.fixture(scope="module")
def settings(taught_model_dir, tmp_path_factory):
    from mage.settings import load_settings

    return load_settings(overrides(taught_model_dir, tmp_path_factory.mktemp("sync-run")))


@pytest.fixture(scope="module")
def backend(settings):
    """The run's engine (full fine-tuning, the starting weights), as the training loop starts it."""
    from mage.backends import vllm
    from mage.models.policy import rollout_backend

    vllm.shutdown_engine()  # another module's engine
    view = rollout_backend(settings)
    yield view
    vllm.shutdown_engine()


def kuhn_table(backend, seed: int) -> pl.DataFrame:
    """A scored Kuhn rollout (4 meta-episodes of 2 episodes) from ``backend``."""
    cfg = compose(["game=kuhn_poker"])
    entries = [e for e in population_entries(cfg) if e.split == "train" and e.id == "conservative"]
    specs = plan_meta_episodes(entries, num_groups=2, group_size=2, seed=0)
    table = RolloutEngine(backend, rollout_config(group_size=2, episodes=2), cfg.game.params).run(
        specs, sampling(temperature=1.0, max_new_tokens=16, seed=seed), progress=False)
    penalties = Penalties(invalid=cfg.game.invalid_penalty, length=cfg.game.length_penalty, max_response_tokens=16)
    return add_advantages(add_returns(table, algo_config(), penalties), algo_config())


def trainer_for(model_dir, adapter=None):
    from mage.models.policy import load_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    policy = load_policy(str(model_dir), dtype="float32", device="cpu", adapter=adapter)
    return PolicyTrainer(policy, train_config(learning_rate=3e-3, mini_batch_size=4), algo_config())


def probe_table(probe) -> pl.DataFrame:
    prompts, responses = probe.rows()
    return pl.DataFrame({"prompt_token_ids": prompts, "response_token_ids": responses})


def table_gap(table: pl.DataFrame, reference: list[list[float]]) -> float:
    gaps = [abs(a - b) for row, ref in zip(table["response_logprobs"].to_list(), reference)
            for a, b in zip(row, ref, strict=True)]
    assert gaps, "no response tokens to compare"
    return max(gaps)


def checkpoints_read_back(monkeypatch) -> list[str]:
    """From now on, the checkpoints any vLLM engine of this process loads from disk."""
    from mage.backends import vllm

    read_back: list[str] = []
    load = vllm.Engine.load_weights

    def counted(self, source):
        if source != self.weights and source != self.spec.model:
            read_back.append(source)
        load(self, source)

    monkeypatch.setattr(vllm.Engine, "load_weights", counted)
    return read_back


def test_the_training_loop_pushes_each_update_and_checks_it(settings, backend, monkeypatch):
    """Two iterations of full fine-tuning on the module's engine (first in the module: it holds
    the starting weights): every update reaches it through memory, checked, and no checkpoint is
    read back; with the push skipped, a third iteration stops the run."""
    from mage.backends import vllm, weight_sync
    from mage.run import RunLayout, train
    from mage.settings import load_settings
    from tasks import worker

    read_back = checkpoints_read_back(monkeypatch)
    worker.forget()
    result = train(settings, progress=False)
    assert result.iterations == [1, 2]
    assert not read_back, f"the engine loaded checkpoints from disk: {read_back}"
    assert backend.engine.weights.endswith("ckpt-00002")  # the checkpoint names what was pushed
    metrics = [json.loads(line) for line in RunLayout.of(settings).metrics.read_text().splitlines()]
    print("weight_sync_gap_max per iteration:", [m["train/weight_sync_gap_max"] for m in metrics])
    assert all(m["train/weight_sync_gap_max"] < TOLERANCE for m in metrics)
    assert all(m["train/rollout_logprob_gap_max"] < TOLERANCE for m in metrics)

    # the run's push (Backend.take_weights) skipped: the check after it stops the run
    monkeypatch.setattr(vllm.VLLMBackend, "take_weights", lambda self, chunks: {"tensors": 0, "seconds": 0.0})
    worker.forget()
    longer = load_settings(overrides(settings.model.path, settings.paths.artifacts, "train.iterations=3"))
    with pytest.raises(weight_sync.StaleWeightsError, match="update 3"):
        train(longer, progress=False)  # resumes at ckpt-00002, its engine's weights; update 3 is not pushed


def test_an_update_pushed_through_memory_is_what_the_engine_serves(backend, taught_model_dir):
    from mage.backends import vllm_sync

    trainer = trainer_for(taught_model_dir)
    table = kuhn_table(backend, seed=1)
    probe = weight_sync.probe_from(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list())
    assert 1 <= len(probe.tokens) <= weight_sync.PROBE_ROWS
    before = trainer.logprobs(probe_table(probe))
    # the engine starts on the trainer's weights
    start_gap = weight_sync.largest_gap(vllm_sync.served_logprobs(backend, probe), before)[0]
    assert start_gap < TOLERANCE

    trainer.update(table, seed=0)
    after = trainer.logprobs(probe_table(probe))
    moved = weight_sync.largest_gap(after, before)[0]
    assert moved > 100 * TOLERANCE, f"the update moved the probe's log-probs by {moved:.2e} only"

    pushed = vllm_sync.push_weights(backend, trainer.model.state_dict().items())
    served = vllm_sync.served_logprobs(backend, probe)
    gap = weight_sync.largest_gap(served, after)[0]
    stale = weight_sync.largest_gap(served, before)[0]
    print(f"pushed {pushed['tensors']} tensors in {pushed['seconds']:.3f} s (repacked {pushed['repacked']}); "
          f"probe gap to the update {gap:.2e}, to the old weights {stale:.2e}")
    assert gap < TOLERANCE
    assert stale > 100 * TOLERANCE
    assert vllm_sync.verify(backend, probe, after, TOLERANCE) == gap
    # generation samples from the pushed weights too, not only prompt scoring
    again = kuhn_table(backend, seed=2)
    sampled = table_gap(again, trainer.logprobs(again))
    print(f"rollout after the push: largest gap to the trainer {sampled:.2e} over {again.height} calls")
    assert sampled < TOLERANCE


def test_an_engine_left_with_stale_weights_stops_the_run(backend, taught_model_dir):
    from mage.backends import vllm_sync

    trainer = trainer_for(taught_model_dir)
    table = kuhn_table(backend, seed=3)
    probe = weight_sync.probe_from(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list())
    vllm_sync.push_weights(backend, trainer.model.state_dict().items())  # in step with this trainer
    assert vllm_sync.verify(backend, probe, trainer.logprobs(probe_table(probe)), TOLERANCE) < TOLERANCE

    trainer.update(table, seed=0)  # new weights, not pushed
    expected = trainer.logprobs(probe_table(probe))
    with pytest.raises(weight_sync.StaleWeightsError, match=r"differ from the trainer's by up to .* above the tolerance"):
        vllm_sync.verify(backend, probe, expected, TOLERANCE)
    # the tied output layer's name left out, as a checkpoint file leaves it: its packed copy is redone
    pushed = vllm_sync.push_weights(backend, [(n, t) for n, t in trainer.model.state_dict().items()
                                              if n != "lm_head.weight"])
    assert pushed["repacked"] == ["lm_head"]
    assert vllm_sync.verify(backend, probe, expected, TOLERANCE) < TOLERANCE


def test_a_rollout_worker_takes_the_weights_into_its_engine_and_reads_no_checkpoint(backend, taught_model_dir,
                                                                                     tmp_path, monkeypatch):
    """A Ray actor's rollout worker (RolloutWorker.take_weights; tests/test_weight_push.py for
    hf): the update's weights, encoded as they cross processes, into its engine, checked; the
    checkpoint they are named after is then held, never read."""
    from mage.models import checkpoint as ckpt
    from mage.run import steps
    from mage.run.state import probe_logprobs, start_training
    from mage.run.worker import RolloutWorker
    from mage.settings import load_settings

    settings = load_settings(overrides(taught_model_dir, tmp_path))
    state = start_training(settings)
    table = kuhn_table(backend, seed=5)
    saved = steps.save(state, steps.update(state, table, 1))
    probe = state.probe(table)
    expected = probe_logprobs(state.policy, probe)
    read_back = checkpoints_read_back(monkeypatch)
    worker = RolloutWorker(settings)
    worker.sample_from(None)  # this process's engine (holding another trainer's weights), nothing loaded
    taken = worker.take_weights(str(saved.path), ckpt.weights_id(saved),
                                weight_sync.encoded(state.policy.model.state_dict().items()), probe, expected)
    print(f"rollout worker: weights taken in {taken['seconds']:.3f} s, probe gap {taken['gap']:.2e}")
    assert taken["gap"] < TOLERANCE
    played = kuhn_table(worker.sample_from(saved.path), seed=6)
    assert table_gap(played, state.trainer.logprobs(played)) < TOLERANCE
    assert not read_back and (worker.loads, worker.pushes) == (0, 1)


def test_a_lora_adapter_is_checked_the_same_way(taught_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mage.backends import vllm, vllm_sync
    from mage.backends.vllm import VLLMBackend

    base = AutoModelForCausalLM.from_pretrained(taught_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                    init_lora_weights=False)).save_pretrained(tmp_path / "adapter")
    vllm.shutdown_engine()
    backend = VLLMBackend(taught_model_dir, dtype="float32", max_model_len=2048, enforce_eager=True, lora_rank=8)
    try:
        table = kuhn_table(backend, seed=4)
        probe = weight_sync.probe_from(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list())
        plain = trainer_for(taught_model_dir).logprobs(probe_table(probe))
        adapted = trainer_for(taught_model_dir, adapter=tmp_path / "adapter").logprobs(probe_table(probe))
        backend.set_adapter(tmp_path / "adapter")
        gap = vllm_sync.verify(backend, probe, adapted, TOLERANCE, "the adapter")
        print(f"LoRA adapter: probe gap to peft {gap:.2e}")
        with pytest.raises(weight_sync.StaleWeightsError, match="the base model"):
            vllm_sync.verify(backend, probe, plain, TOLERANCE, "the base model")
        with pytest.raises(ValueError, match="serves LoRA adapters"):
            vllm_sync.push_weights(backend, [])
    finally:
        vllm.shutdown_engine()
