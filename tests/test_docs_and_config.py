"""Docs that must match the code, and the config tree's validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mage.rollout.schema import describe
from mage.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parent.parent


def test_the_docs_show_the_trajectory_schema_as_the_code_defines_it():
    assert describe() in (REPO / "docs" / "trajectory-table.md").read_text()


def test_the_readme_names_the_two_commands_and_ci_runs_the_test_command():
    readme = (REPO / "README.md").read_text()
    assert "`bash scripts/run.sh`" in readme and "`bash scripts/test.sh`" in readme
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert 'pytest -n 2 --dist loadfile -m "not e2e"' in readme  # the fast tier


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo=foo", "Available options in 'algo'"),
        ("train.foo=1", "allowed keys in train: .*learning_rate"),
        ("+train.foo=1", r"train: unknown key\(s\) \['foo'\] \(in params/train/default.yaml.*\); allowed keys: .*learning_rate"),
        ("train.learning_rate=fast", "train.learning_rate: must be a valid number"),
        ("engine.context_mode=everything", "engine.context_mode: must be 'reflection_only'"),
        ("algo.norm_scope=world", "algo.norm_scope: must be 'group' or 'opponent'"),
        ("algo.episode_baseline=per_turn", "algo.episode_baseline: must be 'pooled' or 'per_episode'"),
        ("+game.params.turn_limt=3", r"game.params: unknown key\(s\) \['turn_limt'\].*turn_limit"),
        ("flow.runner=dask", "flow.runner: must be 'thread', 'process', 'sequential' or 'ray'"),
        ("flow.nightly_cron='at two'", "five-field cron"),
        ("eval.split=everyone", "eval.split: must be 'train', 'held_out' or 'all'"),
        ("population.train.conservative.share=0.5", "shares sum to 1.2"),
    ],
)
def test_a_wrong_key_or_value_names_the_key_and_what_is_allowed(override, message):
    with pytest.raises(SettingsError, match=message):
        load_settings([override])


def test_every_preset_and_the_paper_experiment_compose():
    for overrides in ([], ["game=tic_tac_toe"], ["game=sokoban"], ["model=qwen3_4b"], ["model=qwen2_5_0_5b"],
                      ["algo=grpo"], ["algo=lamer"], ["algo=gigpo"], ["+experiment=paper"],
                      ["+experiment=tic_tac_toe_long"], ["+experiment=sokoban_long"], ["+experiment=sokoban_levels"]):
        settings = load_settings(overrides)
        assert settings.run_name
    # the long Tic-Tac-Toe run is the game's tiny preset (its warm start and baseline), longer
    # and with a five-times KL penalty
    long, default = load_settings(["+experiment=tic_tac_toe_long"]), load_settings(["game=tic_tac_toe"])
    assert (long.game.name, long.train.iterations, long.eval.meta_episodes) == ("tic_tac_toe", 20, 512)
    assert (long.model, long.population) == (default.model, default.population)
    assert (default.algo.kl_coef, long.algo) == (0.1, dataclasses.replace(default.algo, kl_coef=0.5))
    # the long Sokoban run: its own warm start (the wanderer that thinks the cells around the
    # player, a longer build) in its own directory, so the default preset is kept
    long, default = load_settings(["+experiment=sokoban_long"]), load_settings(["game=sokoban"])
    assert (long.game, long.population) == (default.game, default.population)
    # the same method; its length penalty starts at half a longer response limit (256: the reflections list moves)
    assert (long.engine.sampling.max_new_tokens, default.engine.sampling.max_new_tokens) == (256, 128)
    assert long.algo == default.algo
    assert long.model.path != default.model.path and long.model.local_dir == long.model.path
    assert long.model.tiny.bc_rules == ({"rule": "wanderer", "solver_probability": 0.75, "look_around": True},)
    assert long.train.iterations > default.train.iterations
    # the fixed-levels Sokoban run: sokoban_long's warm start, its training entry on levels
    # 0..31, new 2-box levels held out beside the default's, and a run name of its own
    levels = load_settings(["+experiment=sokoban_levels"])
    assert (levels.model, levels.game) == (long.model, long.game)
    entries = {(e.id, e.split): dict(e.game_params) for e in levels.population.entries}
    assert entries == {**{(e.id, e.split): dict(e.game_params) for e in long.population.entries},
                       ("boxes_2", "train"): {"num_boxes": 2, "levels": 32}, ("boxes_2_new", "held_out"): {"num_boxes": 2}}
    assert levels.run_name == "mage-sokoban-levels32-tiny-seed0" != long.run_name
    assert (levels.engine.groups, levels.engine.group_size, levels.engine.sampling.temperature) == (32, 4, 0.7)
    paper = load_settings(["+experiment=paper"])
    assert (paper.model.name, paper.engine.backend, paper.engine.groups, paper.engine.group_size) == (
        "qwen3_4b", "vllm", 16, 8)
    # The real-model presets differ from each other only by name, dtype and LoRA settings.
    a, b = load_settings(["model=qwen3_4b"]).model, load_settings(["model=qwen2_5_0_5b"]).model
    differing = {k for k in a.__dataclass_fields__ if getattr(a, k) != getattr(b, k)}
    assert differing <= {"name", "path", "local_dir", "dtype", "lora", "enable_thinking"}


@pytest.mark.parametrize("game", ["kuhn_poker", "tic_tac_toe", "sokoban"])
@pytest.mark.parametrize("scale", [[], ["+experiment=paper"]])
def test_the_baselines_are_the_paper_s_at_mage_s_episode_budget(game, scale):
    def composed(algo: str):
        return load_settings([f"game={game}", f"algo={algo}", *scale])

    def budget(settings) -> int:  # episodes played per iteration at most
        engine = settings.engine
        return engine.groups * engine.group_size * engine.episodes

    mage = composed("mage")
    assert (mage.algo.objective, mage.algo.estimator, mage.engine.episodes) == ("differential", "gigpo", 3)
    for algo, objective, estimator in (("grpo", "single_episode", "grpo"), ("gigpo", "single_episode", "gigpo")):
        settings = composed(algo)
        assert (settings.algo.objective, settings.algo.estimator) == (objective, estimator)
        assert settings.engine.episodes == 1  # single-episode RL: no reflection, no later episode
        assert budget(settings) == budget(mage)
        assert settings.train == mage.train and settings.eval == mage.eval  # nothing else differs
    lamer = composed("lamer")
    assert lamer.algo.objective == "cumulative" and lamer.engine == mage.engine
    assert load_settings(["algo=grpo"]).algo.norm == "mean_std_norm"
