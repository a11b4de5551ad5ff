"""Rollout throughput: the batched engine against a sequential loop, and the ``hf`` backend
against ``vllm``, side by side.

Every mode plays the same planned Kuhn meta-episodes (64 by default: 8 groups of 8,
N = 3 episodes) with the same model. ``batched`` sends every live meta-episode's call to
the ``hf`` backend together; ``sequential`` makes one ``hf`` call per environment step
(``concurrency=1``); ``vllm`` is ``batched`` with the ``vllm`` backend (vLLM's CPU build
here; its engine start is timed apart, not in the rollout). Each mode runs in its own
subprocess so its peak memory (max RSS, vLLM's engine process included) is its own; the
ratios come from the same invocation.

The same planned work, not the same replies: every mode plays the same meta-episodes (groups,
opponents, seats, deals; checked through a digest of the plan), but ``hf`` seeds a whole
backend call, not each request, so a reply depends on the batch it was sampled in and the
modes sample different replies. Meta-episodes then end after different numbers of calls
(early stop, invalid replies) and tokens. So the ratios are per generated token and per LLM
call, and each mode's calls and tokens are printed beside them; meta-episodes per second is
shown but compares different amounts of decoding.

    python benchmarks/rollout_throughput.py                 # random tiny-size model
    python benchmarks/rollout_throughput.py --model-dir artifacts/models/tiny-kuhn_poker
    python benchmarks/rollout_throughput.py --modes batched vllm

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import hashlib
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

MODES = ("batched", "sequential", "vllm")


def build_random_model(directory: Path) -> None:
    """A tiny-preset-sized Qwen2 model with random weights and a tokenizer trained on game text."""
    from dataclasses import replace

    from mage.backends.scripted import ScriptedBackend
    from mage.rollout import RolloutEngine, plan_meta_episodes
    from mage.settings import load_settings
    from mage.warmstart.tiny import SCRIPTED_SAMPLING, random_model, train_tokenizer

    settings = load_settings(["game=kuhn_poker"])
    entries = list(settings.population.train.values())
    engine = RolloutEngine(ScriptedBackend("random"), replace(settings.engine, group_size=4), settings.game.params)
    table = engine.run(plan_meta_episodes(entries, 8, 4, seed=0), SCRIPTED_SAMPLING, progress=False)
    tokenizer = train_tokenizer(table["prompt"].to_list() + table["response"].to_list(), vocab_size=4096)
    random_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def worker(args: argparse.Namespace) -> None:
    from dataclasses import replace

    import torch

    from mage.backends.hf import HFBackend
    from mage.rollout import RolloutEngine, plan_meta_episodes
    from mage.settings import load_settings

    torch.set_num_threads(args.threads)
    settings = load_settings(["game=kuhn_poker"])
    entries = list(settings.population.train.values())
    groups = args.metas // args.group_size
    specs = plan_meta_episodes(entries, groups, args.group_size, seed=args.seed)
    concurrency = 1 if args.worker == "sequential" else None
    started = time.perf_counter()
    if args.worker == "vllm":
        from mage.backends.vllm import VLLMBackend

        backend = VLLMBackend(args.model_dir, dtype="float32", max_model_len=2048)
    else:
        backend = HFBackend(args.model_dir, batch_size=args.metas)
    start_seconds = time.perf_counter() - started
    rollout = replace(settings.engine, group_size=args.group_size, episodes=args.episodes, concurrency=concurrency)
    engine = RolloutEngine(backend, rollout, settings.game.params)
    sampling = replace(settings.engine.sampling, temperature=1.0, top_p=1.0, top_k=0,
                       max_new_tokens=args.max_new_tokens, seed=args.seed)
    table = engine.run(specs, sampling, progress=False)
    stats = engine.last_stats
    planned = table.select("meta_id", "group_id", "opponent", "seat", "initial_state").unique().sort("meta_id")
    print(json.dumps({
        "mode": args.worker,
        "meta_episodes": stats.meta_episodes,
        "plan": hashlib.sha256(planned.write_csv().encode()).hexdigest(),
        "calls": stats.calls,
        "play_calls": int((table["phase"] == "play").sum()),
        "reflect_calls": int((table["phase"] == "reflect").sum()),
        "backend_calls": stats.backend_calls,
        "generated_tokens": stats.generated_tokens,
        "seconds": stats.total_seconds,
        "generation_seconds": stats.generation_seconds,
        "outside_generation_share": stats.outside_generation_share,
        "rows": table.height,
        "start_seconds": start_seconds,
        "max_rss_mib": max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        / 1024,
    }))
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--metas", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=None, help="default: all (vllm where installed)")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = Path(tmp) / "model"
            build_random_model(model_dir)
        results = {}
        import importlib.util

        modes = args.modes or [m for m in MODES if m != "vllm" or importlib.util.find_spec("vllm")]
        for mode in modes:
            command = [sys.executable, __file__, "--worker", mode, "--model-dir", str(model_dir)]
            for flag in ("metas", "group_size", "episodes", "max_new_tokens", "threads", "seed"):
                command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            # the worker's result is its one JSON line (vLLM logs to stdout too)
            results[mode] = json.loads(next(line for line in output.splitlines() if line.startswith('{"mode"')))

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.threads} threads; model: {args.model_dir or 'random tiny-size Qwen2'}; {time.strftime('%Y-%m-%d')}")
    plans = {r["plan"] for r in results.values()}
    if len(plans) != 1:
        raise SystemExit(f"the modes played different planned meta-episodes: {plans}")
    print(f"workload: {args.metas} Kuhn meta-episodes, N={args.episodes}, max_new_tokens={args.max_new_tokens}; "
          "the same planned meta-episodes in every mode, sampled replies differ (calls and tokens below)\n")
    print("| mode | backend | LLM calls (play / reflect) | generated tokens | backend calls | engine start (s) "
          "| meta-episodes/s | LLM calls/s | generated tokens/s | outside generation | peak RSS (MiB) "
          "| generated tokens/s vs batched hf |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    tokens = {mode: r["generated_tokens"] / r["seconds"] for mode, r in results.items()}
    for mode, r in results.items():
        versus = f"{tokens[mode] / tokens['batched']:.2f}x" if "batched" in tokens else ""
        print(f"| {mode} | {'vllm' if mode == 'vllm' else 'hf'} | {r['calls']} ({r['play_calls']} / "
              f"{r['reflect_calls']}) | {r['generated_tokens']} | {r['backend_calls']} | {r['start_seconds']:.1f} | "
              f"{r['meta_episodes'] / r['seconds']:.2f} | {r['calls'] / r['seconds']:.1f} | {tokens[mode]:.0f} | "
              f"{100 * r['outside_generation_share']:.1f}% | {r['max_rss_mib']:.0f} | {versus} |")
    if "batched" in results and "sequential" in results:
        print("\n" + speedup_line(results["batched"], results["sequential"]))


def speedup_line(batched: dict, sequential: dict) -> str:
    """Batched over sequential per generated token and per LLM call, with what each mode
    played beside the ratios (meta-episodes per second compares different decoding work)."""
    def rate(result: dict, key: str) -> float:
        return result[key] / result["seconds"]

    return (f"batched / sequential: {rate(batched, 'generated_tokens') / rate(sequential, 'generated_tokens'):.1f}x "
            f"generated tokens/s, {rate(batched, 'calls') / rate(sequential, 'calls'):.1f}x LLM calls/s "
            f"({rate(batched, 'meta_episodes') / rate(sequential, 'meta_episodes'):.1f}x meta-episodes/s); "
            f"the same {batched['meta_episodes']} planned meta-episodes, different sampled replies: "
            f"batched {batched['calls']} calls and {batched['generated_tokens']} tokens, "
            f"sequential {sequential['calls']} calls and {sequential['generated_tokens']} tokens")


if __name__ == "__main__":
    main()
