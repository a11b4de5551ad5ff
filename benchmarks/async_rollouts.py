"""Rollouts behind the update against rollout-then-update: the main command's settings (the
tiny preset on Kuhn Poker) for a few iterations at ``train.max_staleness`` 0 and 1, side by
side, alternating ``0, 1, 0, 1, ...`` so drift on a shared machine hits both alike.

Each run is the library's loop in this process (``mage.run.train``: the rollout behind the
update on a thread, sharing the process's cores with it), from the same built preset into a
fresh artifacts folder; its wall time counts the whole loop (the first rollout, every update
and checkpoint) after the model is built. Per run it prints the iterations per hour, the sums
of the rollouts' and the updates' own times (``performance.jsonl``: each part slows down when it
shares the cores with the other), and per pair the ratio of iterations per hour, 1 to 0.

    python benchmarks/async_rollouts.py                        # 2 pairs of 4 iterations
    python benchmarks/async_rollouts.py --pairs 3 --iterations 6 --override engine.groups=8

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the process's, both parts share them)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for both settings")
    args = parser.parse_args()

    import torch

    from mage.run import RunLayout, train
    from mage.settings import load_settings
    from mage.warmstart import prepare_model

    torch.set_num_threads(args.threads)
    base = [*args.override, f"train.iterations={args.iterations}"]
    model_path = Path(prepare_model(load_settings(base))).resolve()
    work = Path(tempfile.mkdtemp(prefix="mage-bench-async-"))

    def run(staleness: int, index: int) -> dict[str, float]:
        root = work / f"staleness{staleness}-{index}"
        settings = load_settings([*base, f"model.path={model_path}", f"train.max_staleness={staleness}",
                                  f"paths.artifacts={root}", f"paths.results={root / 'results'}"])
        started = time.perf_counter()
        train(settings, progress=False)
        seconds = time.perf_counter() - started
        performance = [json.loads(line) for line in RunLayout.of(settings).performance.read_text().splitlines()]
        return {"seconds": seconds, "per_hour": 3600 * args.iterations / seconds,
                "rollout": sum(p["rollout/seconds"] for p in performance),
                "update": sum(p["train/seconds"] for p in performance)}

    print(f"{platform.node()}: {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} torch threads; "
          f"{args.iterations} iterations a run, {args.pairs} pairs; overrides {args.override or 'none'}")
    print()
    print("| pair | staleness | wall (s) | iterations per hour | rollouts (s) | updates (s) | ratio 1 / 0 |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for pair in range(args.pairs):
        rows = {staleness: run(staleness, pair) for staleness in (0, 1)}
        ratios.append(rows[1]["per_hour"] / rows[0]["per_hour"])
        for staleness, row in rows.items():
            print(f"| {pair + 1} | {staleness} | {row['seconds']:.1f} | {row['per_hour']:.0f} | {row['rollout']:.1f} "
                  f"| {row['update']:.1f} | {f'{ratios[-1]:.2f}' if staleness else ''} |", flush=True)
    print(f"\nmedian ratio 1 / 0 over {len(ratios)} pairs: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
