"""The house has floors, and its folders are the floors: each package of ``mage/``, ``tasks/``
(with ``tasks/ray/`` above it) and ``flows/`` stands on one floor, imports only its own floor
and those below, and no modules or folders import each other in a loop. ``mage/`` holds
packages and only the ground-floor modules named in ``LOOSE``: a new module goes into the
package of its concern, and a new package onto a floor here.

Imports are read with ``ast`` from the source: function-local ones (a cycle closed inside a
function is still a cycle for whoever reads or moves the code) and those under
``if TYPE_CHECKING:`` (a type is a dependency for whoever reads the code) included.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("mage", "tasks", "flows")

#: The modules that stay loose in ``mage/``: the package's face, files, tensors, the stop asked
#: of threads, and the library's command line (above everything else of the library).
LOOSE = {"mage": 0, "mage.io": 0, "mage.tensors": 0, "mage.stopping": 0, "mage.__main__": 9}

#: From the bottom: the folders on each floor. A folder may import its own floor's folders
#: (without a loop) and the floors below, never one above.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground: the games, the reply protocol", ("mage/games", "mage/protocol")),
    ("the configuration as written: Hydra's tree composed into typed sections", ("mage/config",)),
    ("what reads one section: the algorithms, the opponents", ("mage/algo", "mage/opponents")),
    ("the generation backends; the validated settings", ("mage/backends", "mage/settings")),
    ("a policy's model and checkpoints; the population, its ceilings and league", ("mage/models", "mage/population")),
    ("the checks before work; rollouts; the trainer", ("mage/preflight", "mage/rollout", "mage/trainer")),
    ("evaluation; the report", ("mage/evaluation", "mage/report")),
    ("building the tiny preset's warm start", ("mage/warmstart",)),
    ("the run: train, evaluate and report from Python", ("mage/run",)),
    ("the library's command line", ()),
    ("Prefect tasks", ("tasks",)),
    ("Ray: the cluster, its actors and workers, and the steps that use them", ("tasks/ray",)),
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
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
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


def folder_of(module: str) -> str:
    """The folder a module stands in (its package's path; a loose module of ``mage/`` is its own)."""
    if module in LOOSE:
        return module
    path = modules()[module]
    return str((path.parent if path.name != "__init__.py" else path.parent).relative_to(REPO))


def floor_of(module: str) -> int:
    """The floor of ``module``'s folder: the longest folder of FLOORS that holds it."""
    if module in LOOSE:
        return LOOSE[module]
    folder = folder_of(module)
    matches = [(len(prefix), number) for number, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
               if folder == prefix or folder.startswith(prefix + "/")]
    assert matches, f"{folder}/ ({module}) is on no floor: add it to FLOORS (tests/test_architecture.py)"
    return max(matches)[1]


def floor_folder(module: str) -> str:
    """The folder of FLOORS that holds ``module`` (a sub-package, ``mage/games/sokoban``, is its
    package's: a package and its parts may import each other's modules, without a loop of modules)."""
    if module in LOOSE:
        return module
    folder = folder_of(module)
    return max((prefix for _, prefixes in FLOORS for prefix in prefixes
                if folder == prefix or folder.startswith(prefix + "/")), key=len)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder of FLOORS -> the folders its modules import (the floor plan's arrows)."""
    folders: dict[str, set[str]] = {floor_folder(m): set() for m in graph}
    for module, targets in graph.items():
        folders[floor_folder(module)] |= {floor_folder(t) for t in targets} - {floor_folder(module)}
    return folders


def test_the_checker_finds_a_cycle_and_a_function_local_and_a_type_checking_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    imports = import_graph()
    # function-local imports count: mage.run.loop imports mage.warmstart inside Steps.prepare
    assert "mage.warmstart" in imports["mage.run.loop"]
    # and so do imports for type hints only: mage.population.manifest names Settings under TYPE_CHECKING
    assert "mage.settings" in imports["mage.population.manifest"]


def test_only_ground_floor_modules_are_loose_in_mage():
    loose = sorted(str(p.relative_to(REPO)) for p in (REPO / "mage").glob("*.py")
                   if ("mage" if p.stem == "__init__" else f"mage.{p.stem}") not in LOOSE)
    assert loose == [], "a module of mage/ goes into the package of its concern (tests/test_architecture.py, LOOSE)"


def test_every_folder_is_on_a_floor_and_every_floor_folder_exists():
    named = {folder for _, folders in FLOORS for folder in folders}
    assert sorted(f for f in named if not (REPO / f / "__init__.py").is_file()) == []
    for module in modules():
        floor_of(module)


def test_there_is_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_folders_import_each_other():
    assert cycles(folder_graph(import_graph())) == []


def test_no_module_imports_one_above_it():
    upward = sorted(f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)})"
                    for module, targets in import_graph().items() for target in targets
                    if floor_of(target) > floor_of(module))
    assert upward == []


def test_the_library_and_the_tasks_below_ray_import_no_ray():
    """Ray lives in ``tasks/ray/`` (and the flows that start it); the library works from a notebook."""
    offenders = []
    for module, path in modules().items():
        if module.startswith(("tasks.ray", "flows")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{module} imports {name}" for name in names if name.split(".")[0] == "ray"]
    assert offenders == []


def test_loading_a_model_never_builds_one():
    graph = import_graph()
    loading = [m for m in graph if m.startswith("mage.models")]
    assert loading and not any(t.startswith("mage.warmstart") for m in loading for t in graph[m])


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
    Train's bookkeeping actors included (tasks/ray/setup.py): it must stay light. The hook the
    runner sets is that module's, and importing it loads neither the library nor torch."""
    import subprocess
    import sys

    from mage.settings import load_settings
    from tasks.ray.cluster import ray_runner

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
