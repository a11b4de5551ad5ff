"""The library's command line (no Prefect): the composed config, the memory plan and the
population manifest.

    python -m mage config [--output FILE] [hydra overrides ...]
    python -m mage config --docs docs/configuration.md
    python -m mage plan [--gpu-gib 80] [hydra overrides ...]
    python -m mage population [hydra overrides ...]

``config`` prints or writes the composed config, validated exactly as the flows validate it
(a bad value is a one-line ``config error:`` and exit status 2, and nothing is written);
``python -m mage config --output params.yaml`` regenerates the committed ``params.yaml``
(``dvc exp run`` composes it the same way, with its ``-S`` overrides), and ``config --docs
docs/configuration.md`` regenerates the committed reference of every key and config group
option (:mod:`mage.settings.reference`; it documents the defaults, so it takes no overrides).
``population`` seeds and writes the population manifest with its ceilings, and prints per split
the three ceilings by episode k and the value of adaptation (docs/method.md, "Three ceilings
per episode"). ``plan`` prints the memory the
configuration plans for on its GPU, part by part (:mod:`mage.preflight.memory_plan`), on this machine's GPU or
on one of ``--gpu-gib`` GiB, and exits with status 2, naming the key to change, where it
cannot fit, as a flow would refuse it. The lifecycle's own commands are the
flows': ``python -m flows --help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from mage import io
    from mage.settings import SettingsError, load_settings

    parser = argparse.ArgumentParser(prog="python -m mage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="print or write the composed, validated config")
    config.add_argument("--output", help="write here (atomically) instead of printing")
    config.add_argument("--docs", metavar="FILE", help="write the Markdown reference of every key and option here")
    config.add_argument("overrides", nargs="*")
    plan = commands.add_parser("plan", help="print the memory plan on the GPU; status 2 where it cannot fit")
    plan.add_argument("--gpu-gib", type=float, help="plan for a GPU of this many GiB (default: this machine's)")
    plan.add_argument("overrides", nargs="*")
    population = commands.add_parser("population", help="seed and write the population manifest")
    population.add_argument("overrides", nargs="*")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "config" and args.docs:
        return _docs(args.docs, args.overrides, args.output)
    try:
        settings = load_settings(args.overrides)
    except SettingsError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    if args.command == "config":
        text = OmegaConf.to_yaml(OmegaConf.create(settings.raw))
        if args.output:
            io.write_text(args.output, text)
        else:
            print(text, end="")
        return 0
    if args.command == "plan":
        return _plan(settings, args.gpu_gib)
    from mage.population.manifest import adaptation_lines, seed_population, write_manifest

    manifest = seed_population(settings)
    path = write_manifest(manifest, settings.paths.population_manifest)
    print(f"population manifest: {path}")
    for line in adaptation_lines(manifest):
        print(line)
    return 0


def _docs(path: str, overrides: Sequence[str], output: str | None) -> int:
    from mage import io
    from mage.settings import SettingsError, load_settings
    from mage.settings.reference import render

    if overrides or output:
        print("config error: --docs documents the defaults of params/ and writes only its own file: give it "
              "neither overrides nor --output", file=sys.stderr)
        return 2
    try:
        load_settings([])  # the defaults are documented only once they validate
    except SettingsError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    io.write_text(path, render())
    print(f"configuration reference: {path}")
    return 0


def _plan(settings, gpu_gib: float | None) -> int:
    from mage.preflight.memory_plan import GIB, MemoryPlanError, check_fits, device_capacity, gpu_plans
    from mage.preflight.placement import placement

    device, capacity = ("the planned GPU", int(gpu_gib * GIB)) if gpu_gib else device_capacity(settings)
    try:
        plans = gpu_plans(settings, capacity, device)
        where = placement(settings)
        if where.on_cluster:
            print(f"on the Ray cluster: {where.describe()}\n")
        print("\n\n".join(memory.table() for memory in plans))
        if capacity is None:
            print("no GPU here: nothing to check against (--gpu-gib N plans for one)")
            return 0
        check_fits(settings, capacity, device)
    except MemoryPlanError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    for memory in plans:
        whose = f" on {memory.role}" if memory.role else ""
        print(f"fits{whose}: {memory.peak / GIB:.1f} of {capacity / GIB:.1f} GiB at the peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
