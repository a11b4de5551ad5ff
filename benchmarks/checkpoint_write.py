"""The checkpoint write on the training loop's critical path: written in turn (the loop waits
for it) against written behind the next rollout (``train.write_behind``; the update waits for
what is left of it). Issue 50.

Each iteration: a real PPO-sized optimizer state is held (AdamW's moments of every weight), the
loop's checkpoint step (:func:`mage.run.steps.save`) writes the weights, the optimizer and the
RNG state, a rollout stand-in runs (``--rollout-forwards`` forward passes of the policy on
fixed random tokens in this thread), then the update's wait (``wait_for_checkpoint``). Blocked
is the time the loop spends in the checkpoint step and in that wait: what the rollout did not
hide; the rollout itself is slower behind, where the writer takes a core from it. The two ways
alternate in one process (in turn, behind, behind, in turn, ...).

The model is a random Qwen2-architecture model of the given shape with the tiny preset's
tokenizer (``benchmarks/weight_sync.py``), or a model directory (``--model``).

    python benchmarks/checkpoint_write.py --hidden-size 1024 --layers 8 --repeats 3

Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from weight_sync import build_tiny_shaped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a model directory (default: a random model of --hidden-size)")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="checkpoints of each way")
    parser.add_argument("--rollout-forwards", type=int, default=6, help="the rollout stand-in's forward passes")
    args = parser.parse_args()

    import torch

    from mage.run import steps
    from mage.run.state import start_training
    from mage.settings import load_settings

    work = Path(tempfile.mkdtemp(prefix="mage-checkpoint-write-"))
    model_dir = args.model or build_tiny_shaped(work / "model", hidden_size=args.hidden_size,
                                                num_layers=args.layers, intermediate_size=3 * args.hidden_size)
    settings = load_settings([f"model.path={model_dir}", "model.build=null", f"paths.artifacts={work}",
                              "train.keep_checkpoints=2", "paths.live=null"])
    state = start_training(settings)
    parameters = [p for p in state.policy.model.parameters() if p.requires_grad]
    for p in parameters:  # AdamW's moments of every weight, as after the first update
        p.grad = torch.full_like(p, 1e-6)
    state.trainer.optimizer.step()
    state.trainer.optimizer.zero_grad(set_to_none=True)
    tokens = torch.randint(0, len(state.policy.tokenizer), (8, 256), generator=torch.Generator().manual_seed(0))

    def rollout() -> None:
        with torch.no_grad():
            for _ in range(args.rollout_forwards):
                state.policy.model(input_ids=tokens)

    timings: dict[str, list[dict[str, float]]] = {"in turn": [], "behind": []}
    iteration = 0
    for repeat in range(args.repeats):
        for way in (("in turn", "behind") if repeat % 2 == 0 else ("behind", "in turn")):
            iteration += 1
            state.iteration = iteration
            started = time.perf_counter()
            steps.save(state, {}, behind=way == "behind")
            saved = time.perf_counter()
            rollout()
            played = time.perf_counter()
            state.wait_for_checkpoint()  # what steps.update does first
            done = time.perf_counter()
            row = {"save": saved - started, "rollout": played - saved, "wait": done - played}
            row["blocked"], row["iteration"] = row["save"] + row["wait"], done - started
            timings[way].append(row)
            print(f"checkpoint {iteration} {way}: " + ", ".join(f"{k} {v:.3f} s" for k, v in row.items()), flush=True)
    state.close()

    size = sum(f.stat().st_size for f in (work / "runs").rglob("ckpt-*/*") if f.is_file()) / 2 / 2**20  # 2 kept
    weights = sum(p.numel() for p in parameters)
    print(f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; "
          f"{weights:,} weights, a checkpoint about {size:,.0f} MiB; {args.repeats} checkpoints each way\n")
    print("| way | blocked, median (s) | in the checkpoint step (s) | waiting at the update (s) | rollout (s) | "
          "checkpoint + rollout (s) |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for way, rows in timings.items():
        summary[way] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        s = summary[way]
        print(f"| {way} | {s['blocked']:.3f} | {s['save']:.3f} | {s['wait']:.3f} | {s['rollout']:.3f} | {s['iteration']:.3f} |")
    print(json.dumps({"weights": weights, "checkpoint_mib": round(size), "median": summary}))


if __name__ == "__main__":
    main()
