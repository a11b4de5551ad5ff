"""bf16 on a CUDA GPU: generation log-probs and the PPO update (skipped where no GPU is present)."""

from __future__ import annotations

import pytest
import torch
from conftest import algo_config, sampling, train_config
from transformers import AutoModelForCausalLM

from mage.backends import GenerationRequest
from mage.backends.hf import HFBackend
from mage.config.sections import LoraSection
from mage.models.policy import load_policy
from mage.trainer.policy_trainer import PolicyTrainer

pytestmark = pytest.mark.gpu


def test_bf16_generation_logprobs_match_a_teacher_forced_pass(tiny_model_dir):
    backend = HFBackend(tiny_model_dir, dtype="bfloat16", device="cuda", batch_size=4)
    prompts = ["Your card: King (K).", "Game: Kuhn Poker, two players. " * 3, "Board:\n  A B C"]
    generations = backend.generate([GenerationRequest(p) for p in prompts],
                                   sampling(temperature=1.0, max_new_tokens=16, seed=0))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).cuda()
    for generation in generations:
        ids = torch.tensor([generation.prompt_token_ids + generation.token_ids], device="cuda")
        with torch.no_grad():
            logits = reference(ids).logits[0].float()
        logprobs = torch.log_softmax(logits[len(generation.prompt_token_ids) - 1 : -1], dim=-1)
        expected = logprobs.gather(1, torch.tensor(generation.token_ids, device="cuda")[:, None]).squeeze(1).tolist()
        # bf16 kernels differ between a cached decode and a full forward pass: a loose tolerance
        assert generation.logprobs == pytest.approx(expected, abs=5e-2)


def test_bf16_lora_update_moves_log_probs_with_the_advantage(tiny_model_dir):
    from test_trainer import fixed_batch, sequence_logprob  # the CPU test's batch and measure

    policy = load_policy(tiny_model_dir, dtype="bfloat16", device="cuda",
                         lora=LoraSection(r=8, alpha=16, dropout=0.0, target_modules=("q_proj", "v_proj", "up_proj")))
    trainer = PolicyTrainer(policy, train_config(learning_rate=1e-2, mini_batch_size=4), algo_config())
    table = fixed_batch(policy)

    before = sequence_logprob(trainer, table)
    first = trainer.update(table, seed=0)
    # The adapter starts at zero (B = 0): policy = reference, so the first KL is zero even in bf16.
    assert first["kl"] == 0.0 and first["peak_memory_mib"] > 0
    for _ in range(4):
        last = trainer.update(table, seed=0)
    after = sequence_logprob(trainer, table)
    for advantage, b, a in zip(table["advantage"], before, after):
        assert (a > b) if advantage > 0 else (a < b)
    assert last["kl"] > 0


def test_the_tiny_build_clones_and_checks_on_the_gpu(tmp_path):
    import json

    from test_tiny_preset import SMALL

    from mage.settings import load_settings
    from mage.warmstart.preset import build_tiny

    directory = build_tiny(load_settings([*SMALL, f"paths.artifacts={tmp_path}", "model.device=cuda"]), progress=False)
    preset = json.loads((directory / "preset.json").read_text())
    assert preset["bc_loss_last"] < preset["bc_loss_first"]
    assert preset["warm_start"]["train"]["all"]["meta_episodes"] == 2
    assert preset["device"].startswith("cuda")  # cloned there, not on the CPU
    assert AutoModelForCausalLM.from_pretrained(directory).config.hidden_size == 32
