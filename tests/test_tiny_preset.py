"""The tiny preset is built locally and loads exactly as a hub model does."""

from __future__ import annotations

import json
import logging

from transformers import AutoModelForCausalLM, AutoTokenizer

from mage.models.build import build_tiny
from mage.models.policy import load_policy
from mage.settings import load_settings
from mage.models.policy import ensure_model

SMALL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=512", "model.tiny.corpus_meta_episodes=16", "model.tiny.bc_meta_episodes=32",
         "model.tiny.bc_steps=2", "model.tiny.bc_short_steps=2", "model.tiny.check_meta_episodes=2"]


def test_build_gives_an_ordinary_model_directory(tmp_path, caplog):
    # on the CPU wherever the tests run: the byte-for-byte repeat below is a CPU property
    settings = load_settings([*SMALL, f"paths.artifacts={tmp_path}", "model.device=cpu"])
    directory = build_tiny(settings, progress=False)
    assert directory == tmp_path / "models" / "tiny-kuhn_poker"
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 32
    # What AutoTokenizer rebuilds from the directory splits text exactly as the trained one did.
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("<action>check</action>", add_special_tokens=False)["input_ids"])
    assert tokens[0] == "<action>" and tokens[-1] == "</action>"  # protocol tags are single tokens
    preset = json.loads((directory / "preset.json").read_text())
    # How the warm start plays, per opponent of both populations, with the ceiling beside it.
    check = preset["warm_start"]
    opponents = {"train": ["conservative", "aggressive", "intermediate"],
                 "held_out": ["cfr_greedy", "cfr_sampled", "bluffer", "calling_station", "random"]}
    for split, names in opponents.items():
        assert set(check[split]) == {*names, "all"}
        for name in names:
            row = check[split][name]
            # 2 meta-episodes per split, shared by its opponents in whole groups: one each
            assert row["meta_episodes"] == 1 and 0 <= row["invalid_rate"] <= 1 and 0 <= row["final_win_rate"] <= 1
            assert 0 <= row["max_win_probability"] <= row["win_ceiling_final"] <= 1
        assert check[split]["all"]["meta_episodes"] == len(names)
    assert preset["game"] == "kuhn_poker" and preset["build"]["bc_rules"] == ["timid"] and preset["device"] == "cpu"
    assert preset["parameters"] == sum(p.numel() for p in model.parameters())
    # The same seed builds the same weights: a preset is reproducible from its config.
    again = build_tiny(settings, tmp_path / "again", progress=False)
    assert (again / "model.safetensors").read_bytes() == (directory / "model.safetensors").read_bytes()

    # A preset already there is used as it is; built with other model.tiny settings, it is still
    # used (reuse can be on purpose), and a warning names what differs.
    weights = (directory / "model.safetensors").read_bytes()
    with caplog.at_level(logging.WARNING, logger="mage.models.policy"):
        assert ensure_model(settings, progress=False) == str(directory)
        assert not caplog.records
        changed = load_settings([*SMALL, f"paths.artifacts={tmp_path}", "model.device=cpu", "model.tiny.bc_steps=3",
                                 "model.tiny.seed=7"])
        assert ensure_model(changed, progress=False) == str(directory)
        assert ensure_model(changed, progress=False) == str(directory)  # once per process, not per call
    assert [r.getMessage().split("(")[1].split(")")[0] for r in caplog.records] == ["bc_steps 2 -> 3, seed 0 -> 7"]
    assert (directory / "model.safetensors").read_bytes() == weights


def test_a_hub_preset_loads_from_a_local_directory(tiny_model_dir, tmp_path):
    # The hub path: a real preset (LoRA, its own dtype) pointed at a locally saved model directory.
    settings = load_settings(["model=qwen2_5_0_5b", f"model.path={tiny_model_dir}", "model.dtype=float32",
                              "+model.lora.target_modules=[q_proj,v_proj]", f"paths.artifacts={tmp_path}"])
    assert ensure_model(settings) == str(tiny_model_dir)
    policy = load_policy(ensure_model(settings), dtype=settings.model.dtype, lora=settings.model.lora)
    assert policy.is_lora and sum(p.numel() for p in policy.model.parameters() if p.requires_grad) > 0
