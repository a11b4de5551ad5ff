"""Every value that cannot be right is rejected before any work, naming the key (issue 18).

The bad values are drawn by hypothesis from outside each field's allowed range (the ranges
are written here from what each setting means, not read from the code), and each must fail
``load_settings``, ``python -m mage config`` and the flows' command line, the last before a
Prefect flow run starts.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import flows.__main__ as flows_cli

# Prefect's console handler keeps the sys.stderr of the moment Prefect is imported: imported inside
# a test (flows_cli.main does), that is the test's captured stream, closed when the test ends, and
# a later test's log line fails on it (this file alone failed so). Imported here, at collection.
import flows.common  # noqa: F401
import mage.__main__ as mage_cli
from mage.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parent.parent


def below(bound: int) -> st.SearchStrategy[int]:
    return st.integers(max_value=bound - 1)


def above(bound: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=bound + 1, max_value=10**15)


def outside(low: float, high: float, low_open: bool = False, high_open: bool = False) -> st.SearchStrategy[float]:
    """Floats outside [low, high] (an open end admits the bound itself)."""
    finite = {"allow_nan": False, "allow_infinity": False}
    under = st.floats(max_value=low, **finite).filter(lambda x: x < low or (low_open and x == low))
    if math.isinf(high):
        return under
    over = st.floats(min_value=high, max_value=1e12, **finite).filter(lambda x: x > high or (high_open and x == high))
    return under | over


def words(allowed: set[str]) -> st.SearchStrategy[str]:
    return st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(lambda w: w not in allowed | {"null", "true", "false"})


#: key -> bad values (what the setting means bounds it; the huge ones would exhaust memory).
BAD_VALUES: dict[str, st.SearchStrategy] = {
    "seed": below(0),
    "run.name": st.sampled_from(["", "../../..", "a/b", ".hidden", "-x", "x" * 201, "a b"]),
    "game.invalid_penalty": outside(0, math.inf),
    "game.length_penalty": outside(0, math.inf),
    "game.params.turn_limit": below(2),  # Kuhn Poker: the agent acts up to twice a hand
    "game.params.payoff_scale": outside(0, math.inf, low_open=True),
    "population.seat_split": outside(0, 1),
    "population.ceilings.n_games": below(1),
    "engine.groups": below(1) | above(65536),
    "engine.group_size": below(1) | above(1024),
    "engine.episodes": below(1) | above(100),
    "engine.max_prompt_tokens": below(1),
    "engine.concurrency": below(1),
    "engine.context_mode": words({"reflection_only", "history_only", "history_and_reflection"}),
    "engine.prompt_overflow": words({"error", "drop_oldest"}),
    "engine.backend": words({"hf", "vllm", "scripted"}),
    "engine.hf.batch_size": below(1),
    "engine.vllm.gpu_memory_utilization": outside(0, 1, low_open=True),
    "engine.scripted.invalid_rate": outside(0, 1),
    "engine.sampling.temperature": outside(0, 100, low_open=True),  # training cannot be greedy
    "engine.sampling.top_p": outside(0, 1, low_open=True),
    "engine.sampling.top_k": below(0),
    "engine.sampling.max_new_tokens": below(1) | above(131072),
    "model.dtype": words({"float32", "bfloat16", "float16"}),
    "model.device": words({"auto", "cpu", "mps", "cuda"}),
    "model.tiny.num_heads": st.integers(1, 128).filter(lambda h: 128 % h != 0) | below(1),
    "model.tiny.vocab_size": below(512),
    "model.tiny.bc_learning_rate": outside(0, 1, low_open=True),
    "model.tiny.bc_moves_only_share": outside(0, 1),
    "model.tiny.bc_constant_lr_share": outside(0, 1),
    "algo.objective": words({"differential", "cumulative", "single_episode"}),
    "algo.norm": words({"mean_norm", "mean_std_norm"}),
    "algo.grouping": words({"stationary", "mixed"}),
    "algo.anchor": words({"global", "local"}),
    "algo.gamma_step": outside(0, 1),
    "algo.gamma_traj": outside(0, 1),
    "algo.clip_ratio": outside(0, 1, low_open=True),
    "algo.dual_clip": st.floats(max_value=1, allow_nan=False, allow_infinity=False),
    "algo.kl_coef": outside(0, math.inf),
    "algo.entropy_coef": outside(0, math.inf),
    "algo.negative_weight": outside(0, 1),
    "train.iterations": below(0) | above(1_000_000),
    "train.learning_rate": outside(0, 1, low_open=True),
    "train.grad_clip": outside(0, math.inf, low_open=True),
    "train.adam_eps": outside(0, 1, low_open=True),
    "train.ppo_epochs": below(1),
    "train.mini_batch_size": below(1),
    "train.keep_checkpoints": below(1),
    "train.eval_every": below(0),
    "train.checkpoint_every": below(1),
    "train.drift_invalid_rise": outside(0, 1, low_open=True),
    "train.drift_kl": outside(0, math.inf, low_open=True),
    "train.lr_schedule": words({"constant", "linear"}),
    "train.batching": words({"bucketed", "padded"}),
    "train.workers": below(1) | above(4096),
    # a whole GPU per update worker or none: a fraction, 1.0 included, is not a count of GPUs
    "train.worker_gpus": below(0) | above(1) | st.floats(0, 1, allow_nan=False),
    "train.worker_cpus": outside(0, 4096),
    "train.sharding": words({"fsdp", "ddp"}),
    "eval.meta_episodes": below(1),
    "eval.episodes": below(1),
    "eval.split": words({"held_out", "train", "all"}),
    "eval.sampling.top_p": outside(0, 1, low_open=True),
    # games held out at evaluation: the game trained on, a game with no files, one listed twice, not a list
    "eval.games": st.sampled_from([["kuhn_poker"], ["chess"], ["leduc_poker", "leduc_poker"], ["../kuhn_poker"],
                                   "leduc_poker"]),
    "flow.runner": words({"thread", "process", "sequential", "ray"}),
    "flow.placement": words({"split", "colocated"}),
    # a Ray address is auto, host:port or ray://host:port: no port, a bad port or a scheme is wrong
    "flow.ray.address": st.sampled_from(["nowhere", "http://h:1", "h:", ":6379", "h:123456", "ray://h", "a b:1"]),
    "flow.ray.num_cpus": below(1),
    "flow.ray.shard_cpus": outside(0, 4096),
    "flow.ray.shard_gpus": outside(0, 64) | st.floats(1.01, 63.99).filter(lambda g: g != int(g)),  # Ray: <= 1 or whole
    "flow.ray.worker_restarts": below(0),
    "flow.ray.connect_timeout_seconds": outside(0, 3600, low_open=True),
    "flow.max_workers": below(1),
    "flow.rollout_shards": below(1),
    "flow.retries": below(0),
    "flow.retry_delay_seconds": outside(0, 86400),
    "flow.api_timeout_seconds": outside(0, 3600, low_open=True),
    "flow.server_start_timeout_seconds": outside(0, 3600, low_open=True),
}


def override(key: str, value: object) -> str:
    if isinstance(value, str):
        return f"{key}='{value}'" if value else f"{key}="
    return f"{key}={value!r}"


@st.composite
def bad_overrides(draw) -> tuple[str, str]:
    key = draw(st.sampled_from(sorted(BAD_VALUES)))
    return key, override(key, draw(BAD_VALUES[key]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(bad_overrides())
def test_a_value_outside_its_range_is_rejected_naming_the_key(case):
    key, text = case
    with pytest.raises(SettingsError) as error:
        load_settings([text])
    message = str(error.value)
    assert message.startswith(key) or message.startswith(key.rsplit(".", 1)[0] + ":"), message
    assert "\n" not in message


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_every_bad_value_stops_the_command_line_before_a_flow_starts(key, monkeypatch, capsys):
    import flows

    text = override(key, find(BAD_VALUES[key], lambda _: True))  # the simplest bad value of each key
    started = []
    monkeypatch.setattr(flows, "load", lambda name: started.append(name) or (lambda **_: None))
    assert flows_cli.main(["train", text]) == 2
    assert not started, "a flow was started"
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and "\n" not in err, err
    assert mage_cli.main(["config", text]) == 2


#: Bad command lines beyond BAD_VALUES' simplest value of each key, the ones the fault probe of
#: issue 18 found slipping through at first: bounds at both ends, lists of the wrong length,
#: names that are not plain, rules between fields, keys and group options that do not exist.
#: Each is one `config error:` line that names what the last override set (its key, or the
#: section and the key that a rule or an unknown key is about).
BAD_COMMAND_LINES = [
    "engine.groups=abc", "engine.groups=0", "engine.groups=-2", "engine.groups=100000000", "engine.hf.batch_size=0",
    "engine.max_prompt_tokens=0", "model.device=tpu", "train.betas=[2,3]", "train.betas=[0.9]",
    "population.seat_split=1.5", "population.seat_split=-0.1", "game.params.turn_limit=0", "train.grad_clip=-1",
    "algo.kl_coef=-1", "algo.clip_ratio=-0.5", "game.invalid_penalty=-5", "train.learning_rate=1e6",
    "train.keep_checkpoints=0", "train.eval_every=-1", "flow.retry_delay_seconds=-1", "engine.scripted.invalid_rate=2",
    "run.name=", "run.name=../../..", "engine.sampling.max_new_tokens=100000000", "model.tiny.num_heads=3",
    "model.tiny.num_kv_heads=3", "population.train.intermediate.share=0.1", "game=sokoban game.params.max_moves=30",
    "game=tic_tac_toe game.params.turn_limit=2", "nonexistent.key=1", "+train.extra=1", "algo=nope", "train=",
    "seed=-1", "flow.api_timeout_seconds=0", "eval.games=[chess]", "eval.games=[kuhn_poker]",
    "eval.games=[liars_dice,liars_dice]", "game=leduc_poker eval.games=[leduc_poker]",
]
#: What the line names where it is not the last override's whole key: a rule over a section,
#: an unknown key of a section.
NAMED = {"population.train.intermediate.share=0.1": ("population.train",), "+train.extra=1": ("train", "extra")}


@pytest.mark.parametrize("command_line", BAD_COMMAND_LINES)
def test_a_bad_value_on_the_command_line_is_one_line_naming_its_key_and_starts_no_flow(command_line, monkeypatch,
                                                                                        capsys):
    import flows

    started = []
    monkeypatch.setattr(flows, "load", lambda name: started.append(name) or (lambda **_: None))
    assert flows_cli.main(["train", *command_line.split()]) == 2
    assert not started, "a flow was started"
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    names = NAMED.get(command_line, (command_line.split()[-1].partition("=")[0].lstrip("+"),))
    assert all(name in err for name in names), (names, err)


@settings(max_examples=40, deadline=None)
@given(outside(0, 10))
def test_a_sokoban_box_reward_outside_zero_to_the_payoff_is_rejected_naming_the_key(value):
    with pytest.raises(SettingsError) as error:
        load_settings(["game=sokoban", override("game.params.box_reward", value)])
    assert str(error.value).startswith("game.params.box_reward must be in [0, payoff_scale (10.0)]"), error.value


@settings(max_examples=40, deadline=None)
@given(st.one_of(below(1).map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr),
                 st.sampled_from(["true", "false", "'3'", "[1]", "{a: 1}", "three"])))
def test_a_bad_level_setting_of_a_population_entry_is_rejected_naming_the_entry(text):
    # population entries override the game's parameters (Sokoban's num_boxes, levels); a bad
    # one used to pass until the first rollout built the entry's game. A float is never a
    # number of levels, 3.0 included.
    with pytest.raises(SettingsError) as error:
        load_settings(["game=sokoban", f"+population.train.boxes_2.game_params.levels={text}"])
    assert str(error.value).startswith("population.train.boxes_2.game_params.levels must be null"), error.value


def test_a_population_entry_names_its_bad_or_unknown_game_parameter():
    with pytest.raises(SettingsError, match=r"population.held_out.boxes_3.game_params.num_boxes must be in \[1, 6\]"):
        load_settings(["game=sokoban", "population.held_out.boxes_3.game_params.num_boxes=7"])
    with pytest.raises(SettingsError, match=r"population.train.boxes_2.game_params: unknown key\(s\) \['colour'\]"):
        load_settings(["game=sokoban", "+population.train.boxes_2.game_params.colour=1"])


def test_a_cross_field_rule_is_checked_before_work():
    with pytest.raises(SettingsError, match=r"game.params.max_moves must be <= turn_limit \* moves_per_turn \(21\)"):
        load_settings(["game=sokoban", "game.params.max_moves=30"])
    with pytest.raises(SettingsError, match="population.train shares sum to 0.7"):
        load_settings(["population.train.intermediate.share=0.1"])
    with pytest.raises(SettingsError, match=r"model.tiny.num_kv_heads must divide num_heads \(4\), got 3"):
        load_settings(["model.tiny.num_kv_heads=3"])


# -- the composed file -------------------------------------------------------------------
@pytest.fixture
def composed(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    assert mage_cli.main(["config", "--output", str(path)]) == 0
    return path


def test_the_written_config_is_the_validated_one_and_loads_back(composed):
    assert load_settings(config_file=composed) == load_settings()


def test_a_truncated_config_file_names_the_missing_section_and_the_file(composed):
    text = composed.read_text()
    cut = text[:1500]
    cut = cut[: cut.rfind("\n") + 1]  # a clean cut: still valid YAML, sections missing
    composed.write_text(cut)
    with pytest.raises(SettingsError, match=rf"^\w+(\.\w+)*: missing.*\(in {composed}\)"):
        load_settings(config_file=composed)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the config file is empty"),
        ("   \n\n", "the config file is empty"),
        ("game: {name: kuhn_poker\n  params: [", "not valid YAML at line"),
        ("- a list\n- of things\n", "must be a mapping of sections, got list"),
    ],
)
def test_an_empty_or_malformed_config_file_is_one_line_naming_it(composed, text, message):
    composed.write_text(text)
    with pytest.raises(SettingsError, match=message) as error:
        load_settings(config_file=composed)
    assert str(composed) in str(error.value) and "\n" not in str(error.value)


def test_a_missing_config_file_is_named(tmp_path, capsys):
    assert flows_cli.main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.strip() == f"config error: {tmp_path / 'nope.yaml'}: no such config file"


def test_a_missing_key_in_the_tree_names_the_key_and_its_file(tmp_path, monkeypatch):
    import shutil

    tree = tmp_path / "params"
    shutil.copytree(REPO / "params", tree)
    train = tree / "train" / "default.yaml"
    train.write_text("\n".join(line for line in train.read_text().splitlines() if not line.startswith("grad_clip:")))
    monkeypatch.setenv("MAGE_CONFIG_DIR", str(tree))
    with pytest.raises(SettingsError, match=r"^train.grad_clip: missing \(in .*train/default.yaml"):
        load_settings()


# -- one place, strictly: no section has a default of its own, and every section is whole --
def test_no_section_field_has_a_default_every_default_lives_in_params():
    import dataclasses

    import mage.config.sections as sections

    kinds = [k for k in vars(sections).values() if isinstance(k, type) and dataclasses.is_dataclass(k)
             and k.__module__ == sections.__name__]
    assert len(kinds) >= 15
    with_defaults = [f"{k.__name__}.{f.name}" for k in kinds for f in dataclasses.fields(k)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert with_defaults == []


@pytest.mark.parametrize(("override", "message"), [
    ("+flow.ray.nodes=3", r"^flow.ray: unknown key\(s\) \['nodes'\]"),
    ("~flow.ray.num_cpus", r"^flow.ray.num_cpus: missing"),
    ("~engine.sampling.top_k", r"^engine.sampling.top_k: missing"),
    ("~model.tiny.check_sampling.top_k", r"^model.tiny.check_sampling.top_k: missing"),
    ("+population.train.conservative.level=2", r"^population.train.conservative: unknown field\(s\) \['level'\]"),
    ("+population.held_out.random.share=lots", r"^population.held_out.random.share: "),
])
def test_nested_sections_and_population_entries_are_built_strictly(override, message):
    with pytest.raises(SettingsError, match=message):
        load_settings([override])


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 100))
def test_grpo_over_several_episodes_is_rejected_saying_how_to_fix_it(episodes):
    with pytest.raises(SettingsError, match=rf"^algo.estimator: grpo is single-episode RL, and engine.episodes is "
                                            rf"{episodes}: set engine.episodes=1"):
        load_settings(["algo=grpo", f"engine.episodes={episodes}"])
    assert load_settings(["algo=grpo"]).engine.episodes == 1


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 50), st.sampled_from(["flow.runner=process", "flow.runner=ray", "engine.backend=vllm"]))
def test_rollouts_from_checkpoints_need_a_checkpoint_every_iteration(every, where):
    with pytest.raises(SettingsError, match=rf"^train.checkpoint_every: must be 1 with {where.split('=')[0]}="
                                            rf".* got {every}; set train.checkpoint_every=1"):
        load_settings([where, f"train.checkpoint_every={every}"])
    # on threads of the trainer's process the rollouts sample from the policy in memory
    assert load_settings(["flow.runner=sequential", f"train.checkpoint_every={every}"]).train.checkpoint_every == every


def test_more_rollout_shards_than_groups_is_rejected():
    with pytest.raises(SettingsError, match=r"^flow.rollout_shards: 17 shards for 16 groups leave 1 with nothing"):
        load_settings(["flow.rollout_shards=17"])


def test_an_objective_or_estimator_that_is_not_registered_is_named_with_the_registered_ones():
    with pytest.raises(SettingsError, match=r"^algo.estimator: must be one of \['gigpo', 'grpo'\] "
                                            r"\(mage.algo.register_estimator adds one\), got 'ppo'"):
        load_settings(["algo.estimator=ppo"])
    with pytest.raises(SettingsError, match=r"^algo.objective: must be one of \['cumulative', 'differential', "
                                            r"'single_episode'\]"):
        load_settings(["algo.objective=final"])


# -- overrides Hydra's parser cannot read: one line in the project's form --------------------
KEYS = st.sampled_from(["run.name", "train.learning_rate", "engine.groups", "game", "+experiment", "flow.ray.address"])
UNREADABLE = st.one_of(
    st.text(st.characters(min_codepoint=0xA0, max_codepoint=0x2FFF), min_size=1, max_size=8),  # outside ASCII, unquoted
    st.sampled_from(["[1,2", "{a:", "[", "{", "'abc", '"abc', "a'b", "[1,[2]", "((x"]),
)


@settings(max_examples=200, deadline=None)
@given(KEYS, UNREADABLE, st.sampled_from(["", "ok-"]))
def test_an_unreadable_override_is_one_line_naming_its_key(key, value, prefix):
    """Non-ASCII unquoted values, unbalanced brackets and quotes: Hydra's lexer would say "no
    viable alternative" first; the project says which key, why, and to quote it."""
    text = f"{key}={prefix}{value}"
    with pytest.raises(SettingsError) as raised:
        load_settings([text])
    message = str(raised.value)
    name = key.lstrip("+")
    assert message.startswith(f"{name}: cannot read the value "), message
    assert "\n" not in message and "viable" not in message and "hydra.cc" not in message, message


@pytest.mark.parametrize(("text", "message"), [
    ("run.name=ünïcødé", "run.name: cannot read the value 'ünïcødé': characters outside ASCII must be quoted"),
    ("train.learning_rate=[1,2", "train.learning_rate: cannot read the value '[1,2': a bracket is not closed"),
    ('run.name="abc', "run.name: cannot read the value '\"abc': a quote is not closed"),
    ("train.iterations", "'train.iterations': an override is key=value"),
    ("rün.name=x", "'rün.name': not a config key"),
    ("=3", "'': not a config key"),
])
def test_each_kind_of_unreadable_override_says_what_is_wrong(text, message, capsys):
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}"):
        load_settings([text])
    assert flows_cli.main(["train", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"config error: {message}") and "\n" not in err, err


def test_a_quoted_value_outside_ascii_is_read_and_then_validated():
    with pytest.raises(SettingsError, match="^run.name must be a plain name"):
        load_settings(['run.name="ünïcødé"'])
    assert load_settings(["run.name='a-b_c.1'"]).run_name == "a-b_c.1"
