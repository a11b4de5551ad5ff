"""Rollout throughput: the batched engine against a sequential loop, side by side.

Both modes play the same planned Kuhn meta-episodes (64 by default: 8 groups of 8,
N = 3 episodes) with the ``hf`` backend and the same model. ``batched`` sends every live
meta-episode's call to the backend together; ``sequential`` makes one backend call per
environment step (``concurrency=1``). Each mode runs in its own subprocess so its peak
memory (max RSS) is its own; the speed ratio comes from the same invocation.

    python benchmarks/rollout_throughput.py                 # random tiny-size model
    python benchmarks/rollout_throughput.py --model-dir artifacts/models/tiny

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_random_model(directory: Path) -> None:
    """A tiny-preset-sized Qwen2 model with random weights and a tokenizer trained on game text."""
    from mage.backends import SamplingSettings
    from mage.backends.scripted import ScriptedBackend
    from mage.config import compose
    from mage.models.tiny import random_model, train_tokenizer
    from mage.population import population_entries
    from mage.rollout import RolloutConfig, RolloutEngine, plan_meta_episodes

    cfg = compose(["game=kuhn_poker"])
    entries = [e for e in population_entries(cfg) if e.split == "train"]
    engine = RolloutEngine(ScriptedBackend("random"), RolloutConfig(group_size=4), cfg.game.params)
    table = engine.run(plan_meta_episodes(entries, 8, 4, seed=0), SamplingSettings(), progress=False)
    tokenizer = train_tokenizer(table["prompt"].to_list() + table["response"].to_list(), vocab_size=4096)
    random_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def worker(args: argparse.Namespace) -> None:
    import torch

    from mage.backends import SamplingSettings
    from mage.backends.hf import HFBackend
    from mage.config import compose
    from mage.population import population_entries
    from mage.rollout import RolloutConfig, RolloutEngine, plan_meta_episodes

    torch.set_num_threads(args.threads)
    cfg = compose(["game=kuhn_poker"])
    entries = [e for e in population_entries(cfg) if e.split == "train"]
    groups = args.metas // args.group_size
    specs = plan_meta_episodes(entries, groups, args.group_size, seed=args.seed)
    concurrency = None if args.worker == "batched" else 1
    backend = HFBackend(args.model_dir, batch_size=args.metas)
    engine = RolloutEngine(
        backend, RolloutConfig(group_size=args.group_size, episodes=args.episodes, concurrency=concurrency), cfg.game.params
    )
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    table = engine.run(specs, sampling, progress=False)
    stats = engine.last_stats
    print(json.dumps({
        "mode": args.worker,
        "meta_episodes": stats.meta_episodes,
        "calls": stats.calls,
        "backend_calls": stats.backend_calls,
        "generated_tokens": stats.generated_tokens,
        "seconds": stats.total_seconds,
        "generation_seconds": stats.generation_seconds,
        "outside_generation_share": stats.outside_generation_share,
        "rows": table.height,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--metas", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=["batched", "sequential"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = Path(tmp) / "model"
            build_random_model(model_dir)
        results = {}
        for mode in ("batched", "sequential"):
            command = [sys.executable, __file__, "--worker", mode, "--model-dir", str(model_dir)]
            for flag in ("metas", "group_size", "episodes", "max_new_tokens", "threads", "seed"):
                command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[mode] = json.loads(output.strip().splitlines()[-1])

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.threads} threads; model: {args.model_dir or 'random tiny-size Qwen2'}; {time.strftime('%Y-%m-%d')}")
    print(f"workload: {args.metas} Kuhn meta-episodes, N={args.episodes}, max_new_tokens={args.max_new_tokens}\n")
    print("| mode | calls | backend calls | meta-episodes/s | generated tokens/s | outside generation | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['calls']} | {r['backend_calls']} | {r['meta_episodes'] / r['seconds']:.2f} | "
              f"{r['generated_tokens'] / r['seconds']:.0f} | {100 * r['outside_generation_share']:.1f}% | {r['max_rss_mib']:.0f} |")
    speedup = (results["batched"]["meta_episodes"] / results["batched"]["seconds"]) / (
        results["sequential"]["meta_episodes"] / results["sequential"]["seconds"]
    )
    print(f"\nbatched / sequential meta-episodes/s: {speedup:.1f}x")


if __name__ == "__main__":
    main()
