"""``dvc.yaml`` declares every project file a stage's flow can run, and every config section its
tasks key on: a change to any of them re-runs the stage, and nothing else does.

A stage's code is the transitive closure of the project imports of its flow's module (every
``import`` and ``from ... import`` of the file, at module level or inside a function: a lazy
import runs when that path runs), plus the package ``__init__`` files Python executes on
the way. Each file of the closure must be under a declared dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("mage", "tasks", "flows")


def module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    path = REPO.joinpath(*parts)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imported_names(path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute, relative ones resolved), and for
    ``from a import b`` also ``a.b`` (b may be a submodule)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def closure(module: str) -> set[str]:
    """Project files (relative paths) that running ``module`` may execute."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # package __init__ files run first
        todo += sorted(imported_names(path))
    return {str(p.relative_to(REPO)) for p in seen}


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
    # flows/train imports the Ray workers inside a function (tasks.training does), and importing
    # tasks.training runs tasks/__init__.py and mage/run/__init__.py
    found = closure("flows.train")
    assert {"tasks/ray_workers.py", "tasks/__init__.py", "mage/run/loop.py", "mage/run/__init__.py"} <= found
    # the population stage never reaches the training tasks
    assert "tasks/training.py" not in closure("flows.seed_population")


#: The steps (mage.run.steps.READS) each stage's flow runs.
STAGE_STEPS = {"seed_population": ("seed_population",), "prepare_model": ("prepare_model",),
               "train": ("start", "rollout", "score", "update"), "evaluate": ("evaluate",),
               "evaluate_start": ("evaluate",), "report": ("report",)}


def test_every_stage_is_mapped_to_its_steps():
    assert set(STAGE_STEPS) == set(stages())


@pytest.mark.parametrize("name", sorted(stages()))
def test_a_stage_declares_the_settings_its_steps_read_and_no_other(name):
    """DVC re-runs a stage when one of its ``params`` changes: they must cover every setting
    the stage's steps read (where files go, ``paths``, is DVC's deps and outs), and each must
    be read by one of them."""
    from mage.run.steps import READS

    params = [str(p) for p in stages()[name].get("params", [])]
    reads = {key for step in STAGE_STEPS[name] for key in READS[step] if not key.startswith("paths.")}
    for key in sorted(reads):
        # a whole section read is covered by its declared sub-keys only where they are all it holds
        covered = any(key == p or key.startswith(p + ".") for p in params)
        assert covered or [p for p in params if p.startswith(key + ".")], \
            f"dvc.yaml stage {name!r} does not declare {key!r}, which its steps read"
    for param in params:
        assert any(param == k or k.startswith(param + ".") or param.startswith(k + ".") for k in reads), \
            f"dvc.yaml stage {name!r} declares {param!r}, which none of its steps reads"
