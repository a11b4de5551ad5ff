"""The published shapes (``config.json`` on the hub) of the models the GPU presets name.

The memory plan (:mod:`mage.preflight.memory_plan`) reads a model's shape from its ``config.json`` when the
model is on this machine, and from here before it is fetched; the benchmarks build random
models of these shapes, at the real vocabulary, where the weights cannot be downloaded.
"""

from __future__ import annotations

from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
        max_position_embeddings=32768),
    "Qwen/Qwen3-4B": dict(
        model_type="qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
        max_position_embeddings=40960),
}

#: The model presets of ``params/model/`` by the hub id they load.
PRESETS = {"qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B-Instruct", "qwen3_4b": "Qwen/Qwen3-4B"}


def random_update_table(rows: int, prompt_tokens: int, reply_tokens: int, vocab_size: int, seed: int = 0):
    """A trajectory table the update accepts (``prompt_token_ids``, ``response_token_ids``,
    ``advantage``): random ids, advantages alternating -1 and +1."""
    import polars as pl
    import torch

    generator = torch.Generator().manual_seed(seed)
    table = [{"prompt_token_ids": torch.randint(1, vocab_size, (prompt_tokens,), generator=generator).tolist(),
              "response_token_ids": torch.randint(1, vocab_size, (reply_tokens,), generator=generator).tolist(),
              "advantage": 1.0 if row % 2 else -1.0} for row in range(rows)]
    return pl.DataFrame(table, schema={"prompt_token_ids": pl.List(pl.Int64), "response_token_ids": pl.List(pl.Int64),
                                       "advantage": pl.Float64})


def random_causal_lm(shape: dict[str, Any], dtype, device: str = "cpu", seed: int = 0, **changes: Any):
    """A seeded random causal LM of ``shape`` (with ``changes``), initialised on ``device``:
    a 4B model is slow to initialise on a CPU and then move."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = {**shape, **changes}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
