"""Ray against the thread runner: the ``train`` flow of the tiny preset with 1 and 2 rollout
shards on each, side by side in one invocation.

Each configuration trains ``--iterations`` iterations (3 by default) into a fresh artifacts
folder. An iteration's time is read from its checkpoint: the first one's from the flow's
start (it includes starting Ray, creating the workers and loading the model), the later
ones from the checkpoint before. The steady iteration is the median of the later ones;
shard start-up is the first iteration less a steady one. Ray's overhead is its steady
iteration against the thread runner's with the same shards. ``ray-2-per-task`` builds the
engine in every shard task (``flow.ray.long_lived_workers=false``): its steady iteration
carries the start-up that long-lived workers pay once.

The configurations run in turn, ``--repeats`` rounds (the order alternates each round),
so drift on a shared machine hits all of them alike. Ray is local (``flow.ray.address``
null, ``flow.ray.num_cpus``) with one CPU per shard; Prefect runs under its test harness.

    python benchmarks/scale_out.py                       # 1 round, 3 iterations each
    python benchmarks/scale_out.py --repeats 2 --override engine.groups=8
    python benchmarks/scale_out.py --only thread-2,ray-2

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="mage-bench-prefect-"))
os.environ.setdefault("RAY_DEDUP_LOGS", "1")

#: name -> (shards, overrides); "ray-2-per-task" builds the engine in every shard task
CONFIGS = {
    "thread-1": (1, ["flow.runner=thread"]),
    "thread-2": (2, ["flow.runner=thread"]),
    "ray-1": (1, ["flow.runner=ray"]),
    "ray-2": (2, ["flow.runner=ray"]),
    "ray-2-per-task": (2, ["flow.runner=ray", "flow.ray.long_lived_workers=false"]),
}


def iteration_seconds(checkpoints: Path, started: float) -> list[float]:
    """Seconds of each iteration, from the checkpoints' manifests' modification times."""
    times = [started] + [p.stat().st_mtime for p in sorted(checkpoints.glob("ckpt-*/manifest.json"))]
    return [b - a for a, b in itertools.pairwise(times)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--only", default=",".join(CONFIGS), help="comma-separated configurations")
    parser.add_argument("--model-path", default=None, help="an existing tiny preset (default: build it under artifacts/)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for every configuration")
    args = parser.parse_args()
    if args.iterations < 2:
        parser.error("--iterations must be at least 2 (a steady iteration is one after the first)")
    chosen = [name.strip() for name in args.only.split(",")]
    if unknown := sorted(set(chosen) - set(CONFIGS)):
        parser.error(f"unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}")

    from prefect.testing.utilities import prefect_test_harness

    from flows.training import train as train_flow
    from mage.run import RunLayout
    from mage.settings import load_settings
    from mage.warmstart import prepare_model
    from tasks import worker

    base = [*args.override, f"train.iterations={args.iterations}", "train.eval_every=0"]
    model_path = args.model_path or prepare_model(load_settings(base))
    base.append(f"model.path={Path(model_path).resolve()}")
    work = Path(tempfile.mkdtemp(prefix="mage-bench-scale-"))
    seconds: dict[str, list[list[float]]] = {name: [] for name in chosen}
    with prefect_test_harness(server_startup_timeout=120):
        for round_ in range(args.repeats):
            for name in chosen if round_ % 2 == 0 else chosen[::-1]:
                folder = work / f"{name}-{round_}"
                shards, settings = CONFIGS[name]
                overrides = [*base, *settings, f"flow.rollout_shards={shards}", f"paths.artifacts={folder}",
                             f"paths.results={folder}/results"]
                worker.forget()  # every configuration loads its model itself
                started = time.time()
                train_flow(overrides)
                seconds[name].append(iteration_seconds(RunLayout.of(load_settings(overrides)).checkpoints, started))
                print(f"{name}: {', '.join(f'{s:.1f}' for s in seconds[name][-1])} s", flush=True)

    steady = {name: statistics.median(s for run in runs for s in run[1:]) for name, runs in seconds.items()}
    first = {name: statistics.median(run[0] for run in runs) for name, runs in seconds.items()}
    print(f"\n{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}; {args.repeats} round(s) of "
          f"{args.iterations} iterations; overrides {args.override or 'none'}\n")
    print("| configuration | shards | first iteration (s) | steady iteration (s) | shard start-up (s) | "
          "steady against thread, same shards |")
    print("|---|---|---|---|---|---|")
    for name in chosen:
        shards = CONFIGS[name][0]
        reference = steady.get(f"thread-{shards}")
        ratio = f"{steady[name] / reference - 1:+.1%}" if reference and not name.startswith("thread") else ""
        print(f"| {name} | {shards} | {first[name]:.1f} | {steady[name]:.1f} | {first[name] - steady[name]:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
