"""``docs/configuration.md`` is generated from ``params/`` and the typed settings
(``python -m mage config --docs docs/configuration.md``): the committed page must be what the
generator writes now, every key of the composed defaults must have a row with its effect,
and every option file of every config group must have a section."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import yaml

from mage.__main__ import main
from mage.config.compose import compose
from mage.settings.reference import COMMAND, DOCS, differences, render

REPO = Path(__file__).resolve().parent.parent


@functools.cache
def generated() -> str:
    return render()


def rows_of(text: str, start: str, end: str | None = None) -> dict[str, list[str]]:
    """The table rows between two headings, by key: their cells."""
    part = text.split(start, 1)[1]
    part = part.split(end, 1)[0] if end else part
    rows = {}
    for line in part.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def leaf_keys(config: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in config.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if dotted in ("population.train", "population.held_out"):
            keys |= {f"{dotted}.<id>.{field}" for entry in value.values() for field in entry}
        elif isinstance(value, dict) and value:
            keys |= leaf_keys(value, dotted)
        else:
            keys.add(dotted)
    return keys


def test_the_committed_page_is_the_generated_one():
    path = REPO / DOCS
    committed = path.read_text() if path.is_file() else ""
    problems = differences(committed, generated())
    assert not problems, (f"{DOCS} is out of date; regenerate it with `{COMMAND}`. What differs, by key:\n"
                          + "\n".join(problems[:40]))


def test_every_key_of_the_defaults_has_a_row_with_a_type_and_an_effect():
    from omegaconf import OmegaConf

    rows = rows_of(generated(), "## The default settings", "## Config groups")
    defaults = OmegaConf.to_container(compose(), resolve=True)
    missing = sorted(leaf_keys(defaults) - set(rows))
    assert missing == [], f"keys of the composed defaults without a row: {missing}"
    assert {key for key, cells in rows.items() if cells[1] == "—" or cells[4] == "—"} == set()
    # a key the settings type is documented with its bounds and its choices
    assert rows["train.learning_rate"][1:4] == ["float", "`0.0002`", "in (0, 1]"]
    assert rows["algo.norm_scope"][3] == "`group`, `opponent`"
    assert rows["algo.objective"][3].startswith("`cumulative`, `differential`, `single_episode`")
    assert rows["model.lora.r"][1:3] == ["int", "—"]  # the tiny preset has no LoRA: the key is still there


def test_every_option_of_every_config_group_has_its_section():
    text = generated()
    params = REPO / "params"
    for path in sorted(params.glob("*/**/*.yaml")):
        group = path.relative_to(params).parts[0]
        option = path.relative_to(params / group).with_suffix("").as_posix()
        heading = f"### {group}={option}"
        assert heading in text, f"{path.relative_to(REPO)} has no section `{heading}` in the generated page"
        data = yaml.safe_load(path.read_text()) or {}
        if group == "algo" and option == "grpo":  # a global file: its keys are the composed config's
            section = rows_of(text, heading + "\n", "\n### ")
            assert section["algo.estimator"][1] == "`grpo`" and section["engine.groups"][1] == "`48`"
            assert "defaults" in data


def test_a_missing_or_stale_key_is_named():
    text = generated()
    line = next(line for line in text.splitlines() if line.startswith("| `algo.kl_coef` |"))
    without = text.replace(line + "\n", "")
    assert differences(without, text) == ['algo.kl_coef (under "algo"): missing']
    cells = line.split(" | ")  # key, type, default, allowed, effect
    stale = text.replace(line, " | ".join([*cells[:2], "`12345.0`", *cells[3:]]))
    [problem] = differences(stale, text)
    assert problem.startswith('algo.kl_coef (under "algo"): stale')
    assert differences(text + "\nhand-written note\n", text) == ["the text outside the key tables differs"]


def test_the_command_writes_the_page_and_refuses_overrides(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert main(["config", "--docs", str(out)]) == 0
    assert out.read_text() == generated()
    assert main(["config", "--docs", str(tmp_path / "other.md"), "game=sokoban"]) == 2
    assert "--docs documents the defaults" in capsys.readouterr().err
    assert not (tmp_path / "other.md").exists()


def test_the_generator_runs_nothing_from_the_config(tmp_path, monkeypatch):
    """params/ is untrusted: a YAML tag that would construct a Python object is refused by
    the safe loader, and nothing it names runs."""
    tree = tmp_path / "params"
    shutil.copytree(REPO / "params", tree)
    marker = tmp_path / "ran"
    (tree / "experiment" / "evil.yaml").write_text(
        f"# @package _global_\nseed: !!python/object/apply:os.system ['touch {marker}']\n")
    monkeypatch.setenv("MAGE_CONFIG_DIR", str(tree))
    with pytest.raises(yaml.YAMLError):
        render()
    assert not marker.exists()
