"""Learning on Kuhn Poker with the tiny preset: MAGE against single-episode GRPO, 3 seeds.

For every (algorithm, seed) a fresh training run starts from the same warm start (the
tiny preset) and trains for ``--iterations`` iterations against the training population;
the final checkpoint and the warm start are evaluated on the same fixed set of initial
states (``--eval-groups`` meta-episodes per opponent, evaluation sampling). GRPO plays one
episode per meta-episode with 3x the groups: both see at most the same number of episodes.
Each run happens in its own subprocess (its own peak memory and wall time).

Then the training step's throughput: one update on the same trajectory table with
length-bucketed micro-batches and with plain fixed-size padded ones, side by side.

    python benchmarks/investigations/learning_kuhn.py      # 3 seeds x {mage, grpo}
    python benchmarks/investigations/learning_kuhn.py --seeds 0 --iterations 5 --eval-groups 8   # smoke run

The defaults are the configuration that met the issue's criterion (docs/notes/findings.md, run D):
groups of 8 meta-episodes as in the paper (docs/method.md, The paper's scale), 24 groups per
iteration and PPO mini-batches of 96 calls. That is about 10 optimizer steps per iteration,
as with 16 groups and mini-batches of 64, but each step averages 1.5x the samples, so there
is less gradient noise and less late drift between seeds. A MAGE run takes about 15 minutes
here. ``--groups 16 --group-size 4 --mini-batch-size 32`` runs the lifecycle's laptop batch.
Per-run results (evaluation per opponent, training curves' last values) are written to
``<out>/runs.json``.

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
OPPONENTS = ("conservative", "aggressive", "intermediate")


def settings_for(args: argparse.Namespace, algo: str = "mage", seed: int = 0, *extra: str):
    from mage.settings import load_settings

    overrides = [
        "game=kuhn_poker", "model=tiny", f"algo={algo}", f"seed={seed}", f"paths.artifacts={args.out}", f"paths.results={args.out}/results",
        f"train.iterations={args.iterations}", f"engine.groups={args.groups}",
        f"engine.group_size={args.group_size}", f"train.mini_batch_size={args.mini_batch_size}", *args.override, *extra,
    ]
    if algo == "grpo":  # one episode per meta-episode, three times the groups: same episode budget
        overrides += ["engine.episodes=1", f"engine.groups={3 * args.groups}"]
    return load_settings(overrides)


METRICS = ("final_win_rate", "final_mean_return", "first_win_rate", "first_mean_return", "invalid_rate",
           "max_win_probability", "best_response_return")


def evaluate_policy(settings, checkpoint, eval_groups: int) -> dict:
    """Final-episode figures per training opponent on the fixed evaluation states, with the
    ceilings of exactly those states (mage.report)."""
    from dataclasses import replace

    from mage.evaluation import evaluate_checkpoint
    from mage.population import seed_population
    from mage.report import per_opponent

    cfg = replace(settings.eval, meta_episodes=3 * eval_groups, episodes=3)
    table = evaluate_checkpoint(settings, checkpoint, ("train",), cfg)["train"]
    rows = per_opponent(table, seed_population(settings, progress=False), cfg.episodes, cfg.early_stop)
    return {r["opponent"]: {k: r[k] for k in METRICS} for r in rows}


def run_worker(args: argparse.Namespace) -> None:
    import torch

    from mage.run import RunLayout, train
    from mage.train import checkpoint as ckpt

    torch.set_num_threads(args.threads)
    algo, seed = args.worker
    settings = settings_for(args, algo, int(seed))
    started = time.perf_counter()
    results = train(settings, progress=False).history  # a fresh --out: every iteration runs here
    train_seconds = time.perf_counter() - started
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    started = time.perf_counter()
    evaluation = evaluate_policy(settings, latest, args.eval_groups)
    eval_seconds = time.perf_counter() - started
    calls = sum(r["rollout/calls"] for r in results)
    last = results[-1]
    print(json.dumps({
        "algo": algo, "seed": int(seed), "iterations": len(results), "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        # where the run ended up: drift shows as a growing KL and entropy, exploits as invalid replies
        "last_kl": last["train/kl"], "last_entropy": last["train/entropy"], "last_invalid_rate": last["rollout/invalid_rate"],
        "llm_calls": calls, "episodes": sum(r.get("rollout/episodes", 0) for r in results),
        "train_tokens_per_second": statistics.mean(r["train/tokens_per_second"] for r in results),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "evaluation": evaluation,
    }))


def throughput_worker(args: argparse.Namespace) -> None:
    import polars as pl
    import torch

    from mage.models.policy import load_run_policy
    from mage.train.trainer import PolicyTrainer

    torch.set_num_threads(args.threads)
    settings = settings_for(args, "mage", 0, f"train.batching={args.throughput}")
    table = pl.read_parquet(args.table)
    trainer = PolicyTrainer(load_run_policy(settings), settings.train, settings.algo,
                            temperature=settings.engine.sampling.temperature)
    metrics = trainer.update(table, seed=0)
    print(json.dumps({
        "batching": args.throughput, "tokens_per_second": metrics["tokens_per_second"], "seconds": metrics["seconds"],
        "padding_share": metrics["padding_share"], "tokens": metrics["tokens"],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def subprocess_json(args: argparse.Namespace, *flags: str) -> dict:
    command = [sys.executable, __file__, *flags, "--out", str(args.out), "--iterations", str(args.iterations),
               "--groups", str(args.groups), "--group-size", str(args.group_size),
               "--mini-batch-size", str(args.mini_batch_size), "--eval-groups", str(args.eval_groups),
               "--threads", str(args.threads)]
    for override in args.override:
        command += ["--override", override]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    """mean [min, max] over seeds."""
    mean = statistics.mean(values)
    return f"{mean:+.2f} [{min(values):+.2f}, {max(values):+.2f}]" if len(values) > 1 else f"{mean:+.2f}"


def verdict(values: list[float], warm: float) -> str:
    """Does it rise above the warm start by more than the spread across seeds (max - min)?"""
    gain = statistics.mean(values) - warm
    width = max(values) - min(values)
    return f"{gain:+.2f} vs {width:.2f}: {'yes' if gain > width and min(values) > warm else 'no'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=["mage", "grpo"])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--groups", type=int, default=24, help="groups per iteration (lifecycle default 16)")
    parser.add_argument("--group-size", type=int, default=8, help="meta-episodes per group (paper 8; lifecycle default 4)")
    parser.add_argument("--mini-batch-size", type=int, default=96, help="calls per optimizer step (paper 64; lifecycle 32)")
    parser.add_argument("--eval-groups", type=int, default=512,
                        help="meta-episodes per opponent (512: standard error ~0.3 on a Kuhn return)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/learning_kuhn"))
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for every run")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--throughput", choices=["bucketed", "padded"], help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return run_worker(args)
    if args.throughput:
        return throughput_worker(args)

    from mage.build import prepare_model
    from mage.run import RunLayout

    base = settings_for(args)
    prepare_model(base)  # one warm start for every run
    warm = evaluate_policy(base, None, args.eval_groups)
    runs = [subprocess_json(args, "--worker", algo, str(seed)) for algo in args.algos for seed in args.seeds]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps({"warm_start": warm, "runs": runs}, indent=1))

    import torch

    group_size = base.engine.group_size
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads; "
          f"{time.strftime('%Y-%m-%d')}; {args.iterations} iterations of {args.groups} groups x {group_size} "
          f"meta-episodes, N=3 (GRPO: {3 * args.groups} groups, N=1); seeds {args.seeds}; eval {args.eval_groups} "
          f"meta-episodes per opponent, temperature 0.7, top-p 0.8, top-k 20; overrides {args.override or 'none'}\n")
    print("Cells: mean [min, max] over seeds. Ceilings are those of the evaluated initial states (exact per deal "
          "and seat); 'rise' is the mean gain over the warm start against the spread (max - min) across seeds.\n")
    header = ("| opponent | metric | warm start | " + " | ".join(args.algos) + " | ceiling | "
              + " | ".join(f"{a} / ceiling" for a in args.algos) + " | " + " | ".join(f"{a} rise" for a in args.algos) + " |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for opponent in [*OPPONENTS, "all"]:
        for metric, ceiling_key in (("final_win_rate", "max_win_probability"), ("final_mean_return", "best_response_return")):
            per_algo = {a: [r["evaluation"][opponent][metric] for r in runs if r["algo"] == a] for a in args.algos}
            ceiling = warm[opponent][ceiling_key]
            cells = [spread(per_algo[a]) for a in args.algos]
            ratios = [f"{statistics.mean(per_algo[a]) / ceiling:.2f}" if ceiling > 0 else "-" for a in args.algos]
            rises = [verdict(per_algo[a], warm[opponent][metric]) for a in args.algos]
            print(f"| {opponent} | {metric} | {warm[opponent][metric]:+.2f} | " + " | ".join(cells)
                  + f" | {ceiling:+.2f} | " + " | ".join(ratios) + " | " + " | ".join(rises) + " |")
        for metric in ("first_win_rate", "invalid_rate"):  # a policy that throws episode 1 shows here
            per_algo = {a: [r["evaluation"][opponent][metric] for r in runs if r["algo"] == a] for a in args.algos}
            print(f"| {opponent} | {metric} | {warm[opponent][metric]:.3f} | "
                  + " | ".join(f"{statistics.mean(v):.3f}" for v in per_algo.values()) + " | - |"
                  + " - |" * len(args.algos) + " - |" * len(args.algos))
    print("\nPer run: final-episode win rate / mean return per opponent, and the last iteration's training figures.\n")
    print("| run | " + " | ".join(OPPONENTS) + " | KL | entropy | invalid (rollout) |")
    print("|---|" + "---|" * (len(OPPONENTS) + 3))
    for r in runs:
        cells = [f"{r['evaluation'][o]['final_win_rate']:.2f} / {r['evaluation'][o]['final_mean_return']:+.2f}" for o in OPPONENTS]
        print(f"| {r['algo']} seed {r['seed']} | " + " | ".join(cells)
              + f" | {r['last_kl']:.3f} | {r['last_entropy']:.3f} | {r['last_invalid_rate']:.3f} |")
    print("\n| run | iterations | LLM calls | train wall time (s) | train tokens/s | eval wall time (s) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['algo']} seed {r['seed']} | {r['iterations']} | {r['llm_calls']:.0f} | {r['train_seconds']:.0f} | "
              f"{r['train_tokens_per_second']:.0f} | {r['eval_seconds']:.0f} | {r['max_rss_mib']:.0f} |")

    table = RunLayout.of(settings_for(args, "mage", args.seeds[0])).rollout(1)
    print("\n| training step batching | tokens/s | padding share | seconds | peak RSS (MiB) |")
    print("|---|---|---|---|---|")
    for batching in ("bucketed", "padded"):
        r = subprocess_json(args, "--throughput", batching, "--table", str(table))
        print(f"| {batching} | {r['tokens_per_second']:.0f} | {100 * r['padding_share']:.1f}% | {r['seconds']:.1f} | {r['max_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
