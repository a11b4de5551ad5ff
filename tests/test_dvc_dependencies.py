"""``dvc.yaml`` declares every project file a stage's flow can run, and every setting its steps
read (``mage.run.reads.READS``): a change to any of them re-runs the stage, and nothing else does.

A stage's code is the transitive closure of the project imports of its flow's module (every
``import`` and ``from ... import`` of the file, at module level or inside a function: a lazy
import runs when that path runs), plus the package ``__init__`` files Python executes on
the way. Each file of the closure must be under a declared dependency.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_architecture import import_graph, modules

REPO = Path(__file__).resolve().parent.parent


def closure(module: str) -> set[str]:
    """Project files (relative paths) that running ``module`` may execute: its imports,
    function-local ones included, and theirs, with the package ``__init__`` files on the way."""
    graph, files = import_graph(), modules()
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # package __init__ files run first
        todo += sorted(graph[name])
    return {str(files[name].relative_to(REPO)) for name in seen}


def stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def flow_module(stage: dict) -> str:
    from flows import FLOWS

    words = stage["cmd"].split()
    assert words[:4] == ["exec", "python", "-m", "flows"], stage["cmd"]  # exec: see the head of dvc.yaml
    return FLOWS[words[4]]


@pytest.mark.parametrize("name", sorted(stages()))
def test_a_stage_declares_the_code_its_flow_imports(name):
    stage = stages()[name]
    declared = [str(d).rstrip("/") for d in stage["deps"] if not str(d).startswith("$")]
    needed = closure(flow_module(stage)) | closure("flows.__main__")  # the command line runs first
    missing = sorted(f for f in needed if not any(f == d or f.startswith(d + "/") for d in declared))
    assert not missing, f"dvc.yaml stage {name!r} does not declare {missing}"


def test_the_closure_follows_lazy_imports_and_packages():
    # flows/training imports the Ray steps inside a function (flow_steps), and importing them runs
    # tasks/__init__.py and tasks/ray/__init__.py; tasks.training's imports run mage/run/__init__.py
    found = closure("flows.training")
    assert {"tasks/ray/steps.py", "tasks/ray/rollouts.py", "tasks/ray/__init__.py", "tasks/__init__.py",
            "mage/run/loop.py", "mage/run/__init__.py"} <= found
    # the population stage never reaches the training tasks
    assert "tasks/training.py" not in closure("flows.population")


#: The steps (mage.run.reads.READS) whose results each stage's outputs are. The train stage's
#: flow also prepares the model (a dep of the stage: its directory) and evaluates during
#: training (not the stage's outputs); its loop's schedule is the ``train`` section.
STAGE_STEPS = {"seed_population": ("seed_population",), "prepare_model": ("prepare_model",),
               "train": ("start", "rollout", "score", "update", "league"),
               "evaluate": ("evaluate", "exploitability"), "evaluate_start": ("evaluate", "exploitability"),
               "report": ("report",)}


def test_every_stage_is_mapped_to_its_steps():
    assert set(STAGE_STEPS) == set(stages())


@pytest.mark.parametrize("name", sorted(stages()))
def test_a_stage_declares_the_settings_its_steps_read_and_no_other(name):
    """DVC re-runs a stage when one of its ``params`` changes: they must cover every setting
    the stage's steps read (where files go, ``paths``, is DVC's deps and outs), and each must
    be read by one of them."""
    from mage.run.reads import READS

    params = [str(p) for p in stages()[name].get("params", [])]
    reads = {key for step in STAGE_STEPS[name] for key in READS[step] if not key.startswith("paths.")}
    for key in sorted(reads):
        assert any(key == p or key.startswith(p + ".") for p in params), \
            f"dvc.yaml stage {name!r} does not declare {key!r}, which its steps read"
    for param in params:
        assert any(param == k or k.startswith(param + ".") or param.startswith(k + ".") for k in reads), \
            f"dvc.yaml stage {name!r} declares {param!r}, which none of its steps reads"
