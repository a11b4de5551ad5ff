"""How the code is put together, for a checkout: its import cycles (``mage/``, ``tasks/``,
``flows/``, function-local imports included, as ``tests/test_architecture.py`` counts them),
and the files that name a setting where it is declared or read, for one key of ``train`` and
for one whole section: what adding such a key or section has to touch.

    python benchmarks/investigations/structure.py                 # this checkout
    python benchmarks/investigations/structure.py ../other-clone  # another one (an older commit, say)

The stand-ins are settings that exist in every version: ``train.grad_clip`` (a key only the
trainer reads), named anywhere in ``mage/``, ``tasks/``, ``flows/``, ``params/``,
``params.yaml`` or ``dvc.yaml`` (not tests, benchmarks or docs); and the sections ``eval`` and
``algo`` (each read by several steps), where they are declared: the class, the settings'
field that holds it, a quoted name in code that lists sections or keys (the steps' reads,
cache keys, in-memory state keys), the config tree's defaults list, the section's folder of
``params/``, ``params.yaml`` and ``dvc.yaml``'s params. The values experiments set
(``params/experiment``, ``params/model_game``) are not declarations.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_architecture import cycles, import_graph  # noqa: E402

#: Where a setting can be declared or read.
SOURCES = ("mage", "tasks", "flows", "params")


def files_naming(root: Path, key: str) -> list[str]:
    """Files of code or config that name ``key`` (a key of a section) anywhere."""
    pattern = re.compile(rf"\b{re.escape(key)}\b")
    candidates = [p for d in SOURCES for p in (root / d).rglob("*") if p.suffix in (".py", ".yaml")]
    candidates += [root / "params.yaml", root / "dvc.yaml"]
    return sorted(str(p.relative_to(root)) for p in candidates if p.is_file() and pattern.search(p.read_text()))


def files_declaring_the_section(root: Path, section: str) -> list[str]:
    """Files that declare ``section``: in Python (not in a comment) a quoted name or dotted key
    in a list of sections or keys, its class, or the settings' field that holds it; in YAML a
    list item (a defaults list, a stage's params) or a top-level key; its folder of params/."""
    name, kind = re.escape(section), rf"{section.capitalize()}Config"
    in_code = re.compile(rf"""^[^#\n]*([(\[{{,]\s*["']{name}["'.]|class {kind}\b)|^\s+{name}: [A-Z]\w*Config$""",
                         re.MULTILINE)
    in_yaml = re.compile(rf"^\s*-\s*{name}\b|^{name}:", re.MULTILINE)
    code = [p for d in ("mage", "tasks", "flows") for p in (root / d).rglob("*.py") if in_code.search(p.read_text())]
    config = [p for p in (root / "params" / "config.yaml", root / "params.yaml", root / "dvc.yaml")
              if p.is_file() and in_yaml.search(p.read_text())]
    folder = sorted((root / "params" / section).glob("*.yaml"))
    return sorted(str(p.relative_to(root)) for p in [*code, *config, *folder])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", nargs="?", default=str(ROOT))
    parser.add_argument("--key", default="grad_clip", help="a key of train that only the trainer reads")
    parser.add_argument("--section", action="append", help="a section (default: eval and algo)")
    args = parser.parse_args()
    root = Path(args.checkout).resolve()
    found = cycles(import_graph(root))
    print(f"{root}: {len(found)} import cycle(s)")
    for component in found:
        print(f"  cycle of {len(component)}: {', '.join(component)}")
    listed = [(f"naming a key of train (train.{args.key})", files_naming(root, args.key))]
    listed += [(f"declaring a section ({s})", files_declaring_the_section(root, s)) for s in args.section or ("eval", "algo")]
    for what, named in listed:
        print(f"files {what}: {len(named)}")
        for name in named:
            print(f"  {name}")


if __name__ == "__main__":
    main()
