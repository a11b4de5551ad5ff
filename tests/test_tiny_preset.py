"""The tiny preset is built locally and loads exactly as a hub model does."""

from __future__ import annotations

import json
import logging

import numpy as np
import polars as pl
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import mage.warmstart.preset as build_module
from mage.algo import Penalties
from mage.algo.returns import penalty_expression
from mage.games.sokoban import generate_level
from mage.models.policy import ModelNotPreparedError, load_policy, model_source
from mage.settings import load_settings
from mage.warmstart import prepare_model
from mage.warmstart.preset import (
    WARM_START_ROLLOUT,
    behaviour_cloning,
    build_differences,
    build_tiny,
    fresh_model,
    learning_rate_factor,
)
from mage.warmstart.tiny import scripted_tables

SMALL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=512", "model.tiny.corpus_meta_episodes=16", "model.tiny.bc_meta_episodes=32",
         "model.tiny.bc_steps=2", "model.tiny.bc_short_steps=2", "model.tiny.check_meta_episodes=2"]


@pytest.mark.e2e
def test_build_gives_an_ordinary_model_directory(tmp_path, caplog):
    # on the CPU wherever the tests run: the byte-for-byte repeat below is a CPU property
    settings = load_settings([*SMALL, f"paths.artifacts={tmp_path}", "model.device=cpu"])
    said: list[str] = []
    directory = build_tiny(settings, progress=False, say=said.append)
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
    # A log hears every stage: 2 + 2 cloning steps (SMALL), each reported, as fewer than BC_REPORTS.
    assert said[0].startswith(f"building the tiny preset 'tiny' for kuhn_poker into {directory}")
    assert [line.split(" (")[0] for line in said if line.startswith("behaviour cloning: step")] == [
        f"behaviour cloning: step {step}/4" for step in (1, 2, 3, 4)]
    assert f"{preset['parameters']:,} parameters" in said[1] and "32 meta-episodes, 4 steps" in said[2]
    assert said[-1].startswith(f"built {directory} in ") and (
        f"train {check['train']['all']['final_win_rate']}, held_out {check['held_out']['all']['final_win_rate']}"
        in said[-1])
    # The same seed builds the same weights: a preset is reproducible from its config.
    again = build_tiny(settings, tmp_path / "again", progress=False)
    assert (again / "model.safetensors").read_bytes() == (directory / "model.safetensors").read_bytes()

    # A preset already there is used as it is; built with other model.tiny settings, it is still
    # used (reuse can be on purpose), and a warning names what differs.
    weights = (directory / "model.safetensors").read_bytes()
    with caplog.at_level(logging.WARNING, logger="mage.warmstart"):
        assert prepare_model(settings, progress=False) == str(directory)
        assert not caplog.records
        changed = load_settings([*SMALL, f"paths.artifacts={tmp_path}", "model.device=cpu", "model.tiny.bc_steps=3",
                                 "model.tiny.seed=7"])
        assert prepare_model(changed, progress=False) == str(directory)
        assert prepare_model(changed, progress=False) == str(directory)  # once per process, not per call
    assert [r.getMessage().split("(")[1].split(")")[0] for r in caplog.records] == ["bc_steps 2 -> 3, seed 0 -> 7"]
    assert (directory / "model.safetensors").read_bytes() == weights
    # A setting the preset does not record (added after it was built) is not compared.
    preset = json.loads((directory / "preset.json").read_text())
    del preset["build"]["bc_moves_only_share"]
    (directory / "preset.json").write_text(json.dumps(preset))
    assert build_differences(directory, settings.model.tiny) == {}
    assert build_differences(directory, changed.model.tiny) == {"bc_steps": (2, 3), "seed": (0, 7)}


def test_a_hub_preset_loads_from_a_local_directory(tiny_model_dir, tmp_path):
    # The hub path: a real preset (LoRA, its own dtype) pointed at a locally saved model directory.
    settings = load_settings(["model=qwen2_5_0_5b", f"model.path={tiny_model_dir}", "model.dtype=float32",
                              "+model.lora.target_modules=[q_proj,v_proj]", f"paths.artifacts={tmp_path}"])
    assert prepare_model(settings) == model_source(settings) == str(tiny_model_dir)
    policy = load_policy(model_source(settings), dtype=settings.model.dtype, lora=settings.model.lora)
    assert policy.is_lora and sum(p.numel() for p in policy.model.parameters() if p.requires_grad) > 0


def test_loading_never_builds_or_downloads(tmp_path):
    """Loading a model finds what prepare_model left; a preset not built, or a hub model not
    fetched, is an error that says how to prepare it, and nothing is built or fetched."""
    tiny = load_settings([*SMALL, f"paths.artifacts={tmp_path}"])
    with pytest.raises(ModelNotPreparedError, match=r"tiny preset is not built there; prepare it first: "
                                                    r"`python -m flows prepare_model`"):
        model_source(tiny)
    hub = load_settings(["model=qwen2_5_0_5b", f"model.local_dir={tmp_path}/qwen"])
    with pytest.raises(ModelNotPreparedError, match=r"Qwen/Qwen2.5-0.5B-Instruct: not in .*/qwen; prepare it first"):
        model_source(hub)
    assert not any(tmp_path.iterdir())


def test_learning_rate_schedule_by_hand():
    # 10 steps, 0.4 of them constant: steps 0-4 at the full rate, then 0.9 off over the last 6
    assert [round(learning_rate_factor(s, 10, 0.4), 6) for s in (0, 4, 5, 7, 10)] == [1.0, 1.0, 0.85, 0.55, 0.1]
    # no constant share: the linear decay over all steps, as before the option existed
    assert [round(learning_rate_factor(s, 10, 0.0), 6) for s in (0, 5, 10)] == [1.0, 0.55, 0.1]
    assert learning_rate_factor(0, 0, 0.0) == 1.0 and learning_rate_factor(3, 3, 1.0) == 1.0


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # the stand-in steps nothing
def test_cloning_phases_draw_the_calls_they_say(monkeypatch):
    """Moves-only short steps see no reflection; the later steps carry bc_reflection_share of
    them; the short phases see the prompts' last bc_context_tokens tokens, the whole phase all
    of them; the learning rate follows the schedule."""
    build = load_settings(["game=sokoban", *SMALL, "model.tiny.bc_short_steps=4", "model.tiny.bc_moves_only_share=0.5",
                           "model.tiny.bc_steps=2", "model.tiny.bc_reflection_share=0.25",
                           "model.tiny.bc_short_batch_rows=8", "model.tiny.bc_batch_rows=8",
                           "model.tiny.bc_context_tokens=16", "model.tiny.bc_constant_lr_share=0.5"]).model.tiny
    tokenizer, model, _ = fresh_model(build)
    table = scripted_tables(load_settings(["game=sokoban"]), [{"rule": "wanderer", "solver_probability": 0.3}], 16, 0,
                            rollout=WARM_START_ROLLOUT)
    reflecting = set(np.flatnonzero((table["phase"] == "reflect").to_numpy()).tolist())
    assert reflecting and len(reflecting) < table.height
    steps = []

    def record(model, optimizer, prompts, responses, rows, pad_id):
        steps.append((rows, max(len(prompts[i]) for i in rows), optimizer.param_groups[0]["lr"]))
        return 0.0

    monkeypatch.setattr(build_module, "_bc_step", record)
    behaviour_cloning(model, tokenizer, table, build, progress=False)
    assert len(steps) == 6
    assert [sum(i in reflecting for i in rows) for rows, _, _ in steps] == [0, 0, 2, 2, 2, 2]
    assert [length <= 16 for _, length, _ in steps] == [True] * 4 + [False] * 2
    # the first 3 of 6 steps constant, so the decay starts from step 3 and takes 0.9 off by step 6
    assert [round(lr, 9) for _, _, lr in steps] == [1e-3, 1e-3, 1e-3, 1e-3, 7e-4, 4e-4]


def test_the_warm_start_is_cloned_on_new_levels_under_a_fixed_training_set():
    """`+experiment=sokoban_levels` trains on levels 0..31; its warm start must not be cloned on
    them (it stands in for a pretrained model): the cloning data are sokoban_long's, and none of
    their levels is one of the 32."""
    rule = [{"rule": "wanderer", "solver_probability": 0.75}]
    fixed = scripted_tables(load_settings(["+experiment=sokoban_levels"]), rule, 32, 0, rollout=WARM_START_ROLLOUT)
    fresh = scripted_tables(load_settings(["+experiment=sokoban_long"]), rule, 32, 0, rollout=WARM_START_ROLLOUT)
    assert fixed["initial_state"].to_list() == fresh["initial_state"].to_list()
    assert fixed["response"].to_list() == fresh["response"].to_list()
    training_levels = {json.dumps(generate_level(i)[0].to_data(), sort_keys=True) for i in range(32)}
    cloned = {json.dumps(json.loads(text)["data"]["level"], sort_keys=True) for text in fixed["initial_state"].unique()}
    assert len(cloned) == 8 and not cloned & training_levels


def test_the_length_penalty_spares_the_longest_reflection_of_the_sokoban_teacher():
    """A Sokoban reflection lists every move of the episode. Under `+experiment=sokoban_long`
    the longest the warm start's teacher writes (every move of every turn blocked) fits under
    half the response limit, where the length penalty starts (docs/method.md, Rewards and returns), counted by the
    preset's own tokenizer, and the warm start's check samples with that limit. The default
    Sokoban preset keeps the other games' 128, which does penalise it (params/model_game/tiny/sokoban.yaml)."""
    from mage.backends.scripted import ScriptedBackend
    from mage.games import make_game

    default, long = load_settings(["game=sokoban"]), load_settings(["+experiment=sokoban_long"])
    params = long.game.params
    assert default.game.params == params
    game = make_game("sokoban", **params)
    for seed in range(100):  # a level whose player starts with a wall above
        episode = game.new_episode(game.initial_state(seed))
        if episode.level.move("up")[1] == "blocked":
            break
    for _ in range(params["turn_limit"]):
        episode.apply_agent_actions([0] * params["moves_per_turn"])
    assert not episode.solved and len(episode.history) == params["turn_limit"] * params["moves_per_turn"]
    reflection = ScriptedBackend._reflect(episode)
    assert reflection.count("up (blocked)") == params["turn_limit"] * params["moves_per_turn"]

    tokenizer_settings = ("corpus_meta_episodes", "seed", "vocab_size")  # what the tokenizer is trained from
    assert [getattr(long.model.tiny, k) for k in tokenizer_settings] == [getattr(default.model.tiny, k) for k in tokenizer_settings]
    tokenizer, _, _ = fresh_model(long.model.tiny)
    tokens = len(tokenizer(reflection, add_special_tokens=False)["input_ids"]) + 1  # and an end token

    def penalty(settings) -> float:  # the length penalty's limit is the run's response limit
        row = pl.DataFrame({"response_token_ids": [list(range(tokens))], "valid": [True]})
        penalties = Penalties(settings.game.invalid_penalty, settings.game.length_penalty,
                              settings.engine.sampling.max_new_tokens)
        return row.select(penalty_expression(penalties))["penalty"].item()

    limit = long.engine.sampling.max_new_tokens
    assert tokens <= limit / 2 and penalty(long) == 0.0
    assert long.model.tiny.check_sampling.max_new_tokens == limit == long.eval.sampling.max_new_tokens
    assert default.engine.sampling.max_new_tokens == 128 and tokens > 64 and penalty(default) < 0.0
