"""The memory plan (mage.preflight.memory_plan) and the GPU presets: parameter counts against transformers'
and peft's own models (built on the meta device: no memory), refusals that name the key,
before any work, and presets that carry their own settings."""

from __future__ import annotations

import pytest
import torch
from conftest import defaults

# imported at collection: Prefect's logging binds the stream that is sys.stderr when it is
# first imported, and a test's captured stream is closed after it
from flows.__main__ import main as flows_main
from flows.common import settings_for
from mage.models.shapes import PRESETS, SHAPES
from mage.preflight.memory_plan import GIB, MemoryPlanError, Shape, check_fits, plan


@pytest.mark.parametrize("hub_id", sorted(SHAPES))
def test_parameter_counts_equal_transformers_and_peft(hub_id):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[hub_id])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shape = Shape.of(SHAPES[hub_id])
    assert shape.parameters() == sum(p.numel() for p in model.parameters())
    lora = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"]))
    assert shape.lora_parameters(16, ("q_proj", "v_proj", "down_proj")) == sum(
        p.numel() for p in lora.parameters() if p.requires_grad)


def test_the_plan_of_the_paper_setting_by_hand():
    """Qwen3-4B + LoRA r=64 on all seven linears: 4,022,468,096 weights in bf16, 132,120,576
    adapter weights in float32 with gradients and two moments; 32,768-token micro-batches,
    checkpointed; vLLM at 0.55 of 80 GiB, asleep during the update."""
    settings = defaults("+experiment=paper")
    memory = plan(settings, 80 * GIB)
    parts = {p.name.split(",")[0].split(" (")[0]: p.bytes for p in memory.parts}
    assert parts["frozen weights"] == 4_022_468_096 * 2
    assert parts["LoRA r=64 adapters"] == 132_120_576 * 4 and parts["gradients"] == 132_120_576 * 4
    assert parts["AdamW moments"] == 132_120_576 * 8
    assert parts["logits"] == 2 * 1024 * 151_936 * 4
    engine = {p.name: p for p in memory.parts if p.name.startswith("vLLM")}
    assert engine["vLLM engine, awake"].bytes == int(0.55 * 80 * GIB) and engine["vLLM engine, awake"].during == "rollout"
    assert engine["vLLM engine, asleep"].during == "update"
    # activations: linear in the tokens; checkpointed, a layer's input per token (bf16) in each
    # of 36 layers plus one layer's worth, against all 36 layers' worth
    half = plan(defaults("+experiment=paper", "train.micro_batch_tokens=16384"), 80 * GIB)
    assert parts["activations"] == 2 * next(p.bytes for p in half.parts if p.name.startswith("activations"))
    plain = plan(defaults("+experiment=paper", "train.gradient_checkpointing=false"), 80 * GIB)
    every = next(p.bytes for p in plain.parts if p.name.startswith("activations"))
    assert parts["activations"] - 32768 * 2560 * 2 * 36 == every / 36
    assert memory.checkpoint_bytes == 132_120_576 * 12 and memory.host_bytes == 0
    assert memory.overflow() is None and check_fits(settings, 80 * GIB) is not None


@pytest.mark.parametrize(("overrides", "key"), [
    (["model=qwen3_4b", "train.gradient_checkpointing=false"], "train.gradient_checkpointing"),
    (["+experiment=paper", "model.lora=null"], "model.lora"),
    (["model=qwen3_4b", "engine.hf.batch_size=64"], "engine.hf.batch_size"),
    (["model=qwen3_4b", "train.logits_chunk_tokens=null", "train.micro_batch_tokens=32768"], "train.logits_chunk_tokens"),
])
def test_a_configuration_that_cannot_fit_is_refused_naming_the_key(overrides, key):
    with pytest.raises(MemoryPlanError, match=rf"^{key}: the plan needs"):
        check_fits(defaults(*overrides), 80 * GIB, "H100")


def test_a_flow_refuses_before_any_work(tmp_path, monkeypatch, capsys):
    """As if on an 80 GiB GPU: the command stops with one line, before a Prefect server, a
    model or the artifacts folder."""
    import mage.preflight.memory_plan

    monkeypatch.setattr(mage.preflight.memory_plan, "device_capacity", lambda settings: ("an 80 GiB GPU", 80 * GIB))
    artifacts = tmp_path / "artifacts"
    code = flows_main(["train", "model=qwen3_4b", "train.gradient_checkpointing=false", f"paths.artifacts={artifacts}"])
    assert code == 2 and not artifacts.exists()
    assert capsys.readouterr().err.startswith("config error: train.gradient_checkpointing: the plan needs")
    # the UI's and deployments' path: the flows that train refuse it, the others load it
    with pytest.raises(MemoryPlanError, match="^train.gradient_checkpointing"):
        settings_for(["model=qwen3_4b", "train.gradient_checkpointing=false"], None, trains=True)
    assert settings_for(["model=qwen3_4b", "train.gradient_checkpointing=false"], None).model.name == "qwen3_4b"
    # a hub model whose shape is unknown until it is fetched: a warning, not a refusal
    assert settings_for(["model=qwen3_4b", "model.path=someone/unknown-model"], None, trains=True)


def test_the_plan_command(capsys):
    from mage.__main__ import main

    assert main(["plan", "--gpu-gib", "80", "model=qwen2_5_0_5b"]) == 0
    out = capsys.readouterr().out
    assert f"| frozen weights (bfloat16) | {494_032_768 * 2 / GIB:.2f} |" in out and "fits:" in out
    assert main(["plan", "--gpu-gib", "24", "+experiment=paper"]) == 2  # the engine's 0.55 and the update do not share 24 GiB


def test_the_gpu_presets_run_as_named():
    """model=X alone carries its own engine and trainer settings; the paper's per-game reply
    limits (Kuhn Poker 8,192, Tic-Tac-Toe 3,072, Sokoban 3,072) and schedule."""
    tiny = defaults()
    for preset in PRESETS:
        settings = defaults(f"model={preset}")
        assert settings.engine.sampling.max_new_tokens >= 1024 > tiny.engine.sampling.max_new_tokens
        assert settings.train.learning_rate <= tiny.train.learning_rate / 10
        assert settings.train.gradient_checkpointing and settings.train.logits_chunk_tokens == 1024
        assert check_fits(settings, 80 * GIB, "H100") is not None  # a valid single-GPU run
    for game, limit in {"kuhn_poker": 8192, "tic_tac_toe": 3072, "sokoban": 3072}.items():
        paper = defaults("+experiment=paper", f"game={game}")
        assert paper.engine.sampling.max_new_tokens == limit and paper.model.enable_thinking is False
        assert (paper.train.iterations, paper.train.mini_batch_size, paper.engine.group_size) == (150, 64, 8)
        assert paper.train.learning_rate == defaults("model=qwen3_4b").train.learning_rate
