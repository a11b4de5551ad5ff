"""The house has floors: no import cycle among ``mage/``, ``tasks/`` and ``flows/``, no module
imports one above it, and command-line entry points live outside the library's modules.

Imports are read with ``ast`` from the source, function-local ones included (a cycle closed
inside a function is still a cycle for whoever reads or moves the code); imports under
``if TYPE_CHECKING:`` are not (they never run).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("mage", "tasks", "flows")

#: From the bottom. A module is on the floor of the longest prefix that names it; it may import
#: its own floor (without a cycle) and the floors below, never one above.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground: games, algorithms, the reply protocol, files, the typed settings, the stop asked of threads",
     ("mage", "mage.io", "mage.stats", "mage.games", "mage.protocol", "mage.algo", "mage.sections", "mage.config",
      "mage.config_comments", "mage.tensors", "mage.stopping")),
    ("opponents and backends, the population and its league, the validated settings and their reference, the "
     "cluster placement, the paths checked before work",
     ("mage.opponents", "mage.backends", "mage.ceilings", "mage.population", "mage.league", "mage.settings",
      "mage.config_docs", "mage.placement", "mage.path_checks")),
    ("rollout", ("mage.rollout",)),
    ("train: loading a policy, the trainer, checkpoints, the memory plan", ("mage.models", "mage.train", "mage.memory")),
    ("evaluation and report, Kuhn Poker's exploitability",
     ("mage.exploitability", "mage.evaluation", "mage.report", "mage.report_markdown", "mage.plots")),
    ("building the tiny preset", ("mage.build",)),
    ("the run and the library's command line", ("mage.run", "mage.__main__")),
    ("Prefect tasks", ("tasks",)),
    ("Prefect flows", ("flows",)),
]


@functools.cache
def modules(root: Path = REPO) -> dict[str, Path]:
    """The project's modules under ``root`` (a checkout), by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines |= {sub.lineno for sub in ast.walk(child) if hasattr(sub, "lineno")}
    return lines


@functools.cache
def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a import b`` names ``a`` and, where it
    is a module, ``a.b``), for the checkout at ``root``."""
    known = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text())
        skip = type_checking_lines(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        graph[module] = {r for t in targets if (r := resolve(t)) and r != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def floor_of(module: str) -> int:
    matches = [(len(prefix), number) for number, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is on no floor: add it to FLOORS (tests/test_architecture.py)"
    return max(matches)[1]


def test_the_checker_finds_a_cycle_and_a_function_local_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    # function-local imports count: mage.run.loop imports mage.build inside Steps.prepare
    assert "mage.build" in import_graph()["mage.run.loop"]


def test_there_is_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_module_imports_one_above_it():
    upward = sorted(f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)})"
                    for module, targets in import_graph().items() for target in targets
                    if floor_of(target) > floor_of(module))
    assert upward == []


def test_loading_a_model_never_builds_one():
    graph = import_graph()
    loading = [m for m in graph if m.startswith("mage.models")]
    assert loading and not any(t.startswith("mage.build") for m in loading for t in graph[m])


@pytest.mark.parametrize("package", ["mage"])
def test_command_line_entry_points_live_outside_library_modules(package):
    """``python -m mage`` (``mage/__main__.py``) is the library's command line; no other module
    of the library defines a ``main`` or runs as a script."""
    offenders = []
    for path in sorted((REPO / package).rglob("*.py")):
        if path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                offenders.append(f"{path.relative_to(REPO)}: def main")
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                offenders.append(f"{path.relative_to(REPO)}: if __name__ == '__main__'")
    assert offenders == []


def test_the_ray_worker_setup_hook_imports_nothing_of_the_library():
    """Ray imports the hook's module in every worker process it starts, idle ones and Ray
    Train's bookkeeping actors included (tasks/ray_setup.py): it must stay light. The hook the
    runner sets is that module's, and importing it loads neither the library nor torch."""
    import subprocess
    import sys

    from flows.ray_cluster import ray_runner
    from mage.settings import load_settings

    runner = ray_runner(load_settings(["flow.runner=ray"]).flow)
    hook = runner.init_kwargs["runtime_env"]["worker_process_setup_hook"]
    module, _, name = hook.rpartition(".")
    check = (f"import sys, {module}\n"
             f"assert callable({module}.{name})\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'mage', 'torch', 'transformers', 'prefect', "
             "'polars', 'ray'}))\n")
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{module} imports {done.stdout.strip()}"
