"""The vLLM backend (GPU machines with the `gpu` extra; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mage.backends import GenerationRequest, SamplingSettings

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]


def test_vllm_matches_the_policy_logprobs(tiny_model_dir):
    from mage.backends.vllm import VLLMBackend

    backend = VLLMBackend(tiny_model_dir, dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    prompts = ["Your card: King (K).", "Game: Kuhn Poker, two players. " * 3]
    generations = backend.generate(
        [GenerationRequest(p) for p in prompts], SamplingSettings(temperature=0.8, top_k=20, max_new_tokens=16, seed=0)
    )
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for generation in generations:
        ids = torch.tensor([generation.prompt_token_ids + generation.token_ids])
        with torch.no_grad():
            logits = reference(ids).logits[0]
        logprobs = torch.log_softmax(logits[len(generation.prompt_token_ids) - 1 : -1], dim=-1)
        expected = logprobs.gather(1, torch.tensor(generation.token_ids)[:, None]).squeeze(1).tolist()
        assert generation.logprobs == pytest.approx(expected, abs=2e-3)
    assert backend.llm.llm_engine.cache_config.enable_prefix_caching
