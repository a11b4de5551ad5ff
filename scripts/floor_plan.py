"""The floor plan in figures, for this checkout or another one (an older commit, say):

    python scripts/floor_plan.py                 # this checkout
    python scripts/floor_plan.py --repo DIR      # another checkout (git worktree add DIR COMMIT)

Prints the loose modules of ``mage/``, the folders and modules, the import cycles among
modules and among folders (imports inside functions and under ``TYPE_CHECKING`` count), the
arrows that run back up (from a folder to one that imports it back, directly or not: no order
of floors puts both below each other), and the lines of ``flows/`` and ``tasks/``. The import
reader and the floors are those of ``tests/test_architecture.py``, which holds this checkout to
them; here any layout is measured, the floors list or not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_architecture import PACKAGES, cycles, import_graph, modules  # noqa: E402


def folder(root: Path, module: str, path: Path) -> str:
    """The folder a module stands in, as a path from the checkout: a package of ``mage/`` with its
    sub-packages (``mage/games`` holds ``mage/games/sokoban``); a loose module of ``mage/`` is itself."""
    where = path.parent.relative_to(root)
    if str(where) == "mage" and path.name != "__init__.py":
        return module
    return "/".join(where.parts[:2]) if where.parts[0] == "mage" else str(where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    root = parser.parse_args(argv).repo.resolve()
    found, graph = modules(root), import_graph(root)
    folders = {m: folder(root, m, p) for m, p in found.items()}
    folder_arrows: dict[str, set[str]] = {f: set() for f in folders.values()}
    for module, targets in graph.items():
        folder_arrows[folders[module]] |= {folders[t] for t in targets} - {folders[module]}
    folder_cycles = cycles(folder_arrows)
    in_cycle = {f: i for i, members in enumerate(folder_cycles) for f in members}
    back_up = sorted(f"{a} -> {b}" for a, targets in folder_arrows.items() for b in targets
                     if a in in_cycle and in_cycle[a] == in_cycle.get(b))
    loose = sorted(m for m, p in found.items() if p.parent == root / "mage" and p.name != "__init__.py")
    library = {f for m, f in folders.items() if m.startswith("mage.") and f not in loose}
    lines = {package: sum(len(p.read_text().splitlines()) for p in (root / package).rglob("*.py"))
             for package in PACKAGES}
    print(f"checkout: {root}")
    print(f"loose modules in mage/: {len(loose)} ({', '.join(loose)})")
    print(f"folders of mage/: {len(library)}; modules: mage {sum(m.startswith('mage') for m in found)}, "
          f"tasks {sum(m.startswith('tasks') for m in found)}, flows {sum(m.startswith('flows') for m in found)}")
    print(f"import cycles among modules: {len(cycles(graph))} {cycles(graph)}")
    print(f"import cycles among folders: {len(folder_cycles)} {folder_cycles}")
    print(f"arrows that run back up (within a cycle of folders): {len(back_up)}")
    for arrow in back_up:
        print(f"  {arrow}")
    print(f"lines: flows/ {lines['flows']}, tasks/ {lines['tasks']}, mage/ {lines['mage']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
