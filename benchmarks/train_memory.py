"""Peak memory of one PPO update against the reply length: log-probs through the output layer
in chunks (``train.logits_chunk_tokens``) against every position's logits at once.

The model is a random Qwen2-architecture causal LM at Qwen's real vocabulary (151,936) with a
small hidden size, so that on a CPU the output layer and its logits are most of the memory,
as they are at paper scale. Each measurement runs in a fresh process (its peak is its own):
one warm-up update, then ``--repeats`` measured updates (``PolicyTrainer.update``: old and
reference log-probs, then the PPO pass, params/'s trainer and method settings), the two
paths alternating. Peak memory is the update's rise above the process's memory once the model
and the optimizer exist: the allocator's peak on a GPU, the peak resident set on a CPU.

    # the CPU sweep of BENCHMARKS.md, "Paper scale on one GPU" (about 10 minutes on 2 cores,
    # about 12 GB at its peak)
    python benchmarks/train_memory.py
    # at Qwen3-4B's shape with LoRA r=64 and gradient checkpointing, on a GPU
    python benchmarks/train_memory.py --shape Qwen/Qwen3-4B --lora 64 --gradient-checkpointing \\
        --device cuda --dtype bfloat16 --rows 6

Prints a Markdown table; its last line is JSON: ``{"peak_mib": {...}, "unchunked_peak_mib":
{...}, ...}`` keyed by reply length, with the tokens/s of both paths at ``--speed-length``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

SMALL = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=16384)


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        import os

        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(args: argparse.Namespace) -> dict:
    """One process's measurement (the ``--child`` side)."""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from mage.config.sections import LoraSection
    from mage.models.policy import as_policy
    from mage.models.shapes import SHAPES, random_causal_lm, random_update_table
    from mage.settings import load_settings
    from mage.trainer.policy_trainer import PolicyTrainer

    torch.set_num_threads(args.threads)
    shape = SMALL if args.shape == "small" else SHAPES[args.shape]
    lora = None
    if args.lora:  # on the GPU presets' modules (params/model/)
        targets = load_settings(["model=qwen3_4b"]).model.lora.target_modules
        lora = LoraSection(r=args.lora, alpha=2 * args.lora, dropout=0.0, target_modules=targets)
    held = torch.float32 if lora is None else getattr(torch, args.dtype)  # full training: float32 master weights
    model = random_causal_lm(shape, held, args.device)
    policy = as_policy(model, SimpleNamespace(pad_token_id=0), f"random {args.shape}", dtype=args.dtype, lora=lora)
    defaults = load_settings()
    tokens = args.rows * (args.prompt + args.length)
    cfg = dataclasses.replace(defaults.train, mini_batch_size=args.rows, micro_batch_tokens=tokens,
                              logits_chunk_tokens=args.chunk or None, gradient_checkpointing=args.gradient_checkpointing)
    trainer = PolicyTrainer(policy, cfg, defaults.algo)
    table = random_update_table(args.rows, args.prompt, args.length, shape["vocab_size"])
    cuda = args.device.startswith("cuda")
    try:
        return _measured(trainer, table, args, cuda)
    except torch.OutOfMemoryError:  # the whole-logits path at long replies, on a GPU
        return {"peak_mib": None, "seconds": None, "tokens_per_second": None}


def _measured(trainer, table, args: argparse.Namespace, cuda: bool) -> dict:
    import resource

    import torch

    trainer.update(table, seed=1)  # warm-up: kernels, allocator, the optimizer's state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = _rss_mib()
    seconds = []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        trainer.update(table, seed=repeat)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    response_tokens = args.rows * args.length
    return {"peak_mib": peak - before, "seconds": min(seconds), "tokens_per_second": response_tokens / min(seconds)}


def child(args: argparse.Namespace, length: int, chunk: int, rows: int, repeats: int) -> dict:
    command = [sys.executable, __file__, "--child", "--length", str(length), "--chunk", str(chunk), "--rows", str(rows),
               "--repeats", str(repeats), "--shape", args.shape, "--device", args.device, "--dtype", args.dtype,
               "--prompt", str(args.prompt), "--threads", str(args.threads), "--lora", str(args.lora)]
    if args.gradient_checkpointing:
        command.append("--gradient-checkpointing")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the measurement {command[2:]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 3072], help="reply lengths (tokens)")
    parser.add_argument("--rows", type=int, default=1, help="replies per update (one micro-batch)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--chunk", type=int, default=1024, help="train.logits_chunk_tokens of the chunked path")
    parser.add_argument("--speed-length", type=int, default=256, help="the reply length of the tokens/s comparison")
    parser.add_argument("--speed-rows", type=int, default=8, help="rows of the tokens/s comparison (several chunks)")
    parser.add_argument("--repeats", type=int, default=3, help="measured updates per process (the fastest counts)")
    parser.add_argument("--speed-rounds", type=int, default=2,
                        help="fresh processes per path for the tokens/s (0: memory only)")
    parser.add_argument("--shape", default="small", help="'small' or a hub id of mage.models.shapes.SHAPES")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return

    import torch

    from mage.models.shapes import SHAPES

    vocab = (SMALL if args.shape == "small" else SHAPES[args.shape])["vocab_size"]
    machine = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{platform.machine()} CPU, {args.threads} threads"
    training = f"LoRA r={args.lora}" if args.lora else "full fine-tuning"
    print(f"machine: {machine}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; model {args.shape} at vocabulary "
          f"{vocab}, {training}, {args.dtype}, gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}; {args.rows} row(s) of {args.prompt} prompt tokens; "
          f"chunks of {args.chunk}\n")
    print("| reply tokens | chunked peak (MiB) | whole-logits peak (MiB) | ratio |")
    print("|---|---|---|---|")
    peak, whole = {}, {}
    shown = lambda mib: "out of memory" if mib is None else f"{mib:.0f}"  # noqa: E731
    for length in args.lengths:
        peak[length] = child(args, length, args.chunk, args.rows, 1)["peak_mib"]
        whole[length] = child(args, length, 0, args.rows, 1)["peak_mib"]
        ratio = f"{peak[length] / whole[length]:.3f}" if peak[length] and whole[length] else "-"
        print(f"| {length} | {shown(peak[length])} | {shown(whole[length])} | {ratio} |", flush=True)
    speed = {"chunked": [], "whole": []}
    for _ in range(args.speed_rounds):  # alternating, each path in fresh processes; the faster counts
        for name, chunk in (("chunked", args.chunk), ("whole", 0)):
            speed[name].append(child(args, args.speed_length, chunk, args.speed_rows, args.repeats)["tokens_per_second"])
    fast = {name: max((v for v in values if v is not None), default=None) for name, values in speed.items()}
    if fast["chunked"] and fast["whole"]:
        print(f"\nupdate tokens/s at {args.speed_length}-token replies, {args.speed_rows} rows: chunked "
              f"{fast['chunked']:.0f}, whole logits {fast['whole']:.0f} (ratio {fast['chunked'] / fast['whole']:.3f})")
    rounded = lambda value: None if value is None else round(value, 1)  # noqa: E731
    measured = {"peak_mib": {str(k): rounded(v) for k, v in peak.items()},
                "unchunked_peak_mib": {str(k): rounded(v) for k, v in whole.items()}}
    if args.speed_rounds:  # --speed-rounds 0: memory only
        measured |= {"tokens_per_second": {str(args.speed_length): rounded(fast["chunked"])},
                     "unchunked_tokens_per_second": {str(args.speed_length): rounded(fast["whole"])}}
    print(json.dumps(measured))


if __name__ == "__main__":
    main()
