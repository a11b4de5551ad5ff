"""The PPO training step's throughput and peak memory: length-bucketed against padded batches.

One update (`PolicyTrainer.update`: old and reference log-probs, then the PPO mini-batches)
on the same trajectory table, once per batching, each with a fresh policy, after one
warm-up update on a slice of the table (CUDA context, kernels, allocator). The model is
either a saved model directory (the tiny preset) or a random model of a real model's
shape, saved to a directory and loaded through the ordinary path (``from_pretrained``),
with the tokenizer of the table (ids beyond the tokenizer's vocabulary are never used,
but the full-size output layer costs what it costs in the real model).

    # a table of a learning run, the tiny preset, on the CPU
    python benchmarks/train_step.py --table artifacts/runs/<run>/rollouts/iteration-00001.parquet \\
        --tokenizer artifacts/models/tiny-kuhn_poker
    # on a GPU: the Qwen2.5-0.5B and Qwen3-4B shapes, bf16, LoRA as in params/model/*.yaml
    python benchmarks/train_step.py --table ... --tokenizer ... --shape qwen2_5_0_5b qwen3_4b \\
        --device cuda --dtype bfloat16

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from mage.models.shapes import PRESETS


def preset_lora(shape: str):
    """The LoRA settings of the model preset ``params/model/<shape>.yaml``."""
    from mage.settings import load_settings

    return load_settings([f"model={shape}"]).model.lora


def save_random_model(shape: str, tokenizer_dir: Path, directory: Path, device: str, dtype: str) -> None:
    """A seeded random model of preset ``shape`` with the table's tokenizer, saved as a model directory."""
    import torch
    from transformers import AutoTokenizer

    from mage.models.shapes import PRESETS, SHAPES, random_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = random_causal_lm(SHAPES[PRESETS[shape]], getattr(torch, dtype), device, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def measure(model_dir: Path, table, batching: str, checkpointing: bool, args: argparse.Namespace, lora) -> dict | None:
    """The metrics of one update, or None if it ran out of GPU memory."""
    from dataclasses import replace

    import torch

    from mage.models.policy import load_policy
    from mage.settings import load_settings
    from mage.trainer.policy_trainer import PolicyTrainer

    torch.manual_seed(0)  # the same LoRA initialisation for every row of the table
    policy = load_policy(model_dir, dtype=args.dtype, device=args.device, lora=lora)
    defaults = load_settings()  # params/'s trainer and method, with this row's batching
    cfg = replace(defaults.train, mini_batch_size=args.mini_batch_size, batching=batching,
                  micro_batch_tokens=args.micro_batch_tokens, micro_batch_rows=args.micro_batch_rows,
                  gradient_checkpointing=checkpointing)
    trainer = PolicyTrainer(policy, cfg, defaults.algo)
    try:
        trainer.update(table.head(args.mini_batch_size), seed=1)  # warm-up: not measured
        metrics = trainer.update(table, seed=0)
    except torch.OutOfMemoryError:
        metrics = None
    del trainer, policy
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, required=True, help="a rollout table with advantages (parquet)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the model directory whose tokenizer made the table")
    parser.add_argument("--shape", nargs="+", default=["saved"], choices=["saved", *PRESETS],
                        help="'saved': the --tokenizer directory's own model, full fine-tuning")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--mini-batch-size", type=int, default=64)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--micro-batch-rows", type=int, default=8)
    parser.add_argument("--batching", nargs="+", default=["bucketed", "padded"], choices=["bucketed", "padded"])
    parser.add_argument("--gradient-checkpointing", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import polars as pl
    import torch


    torch.set_num_threads(args.threads)
    table = pl.read_parquet(args.table)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{platform.machine()} CPU"
    print(f"machine: {device}, torch {torch.__version__}, {args.dtype}; {time.strftime('%Y-%m-%d')}; table "
          f"{args.table.name}: {table.height} calls, {table['response_token_ids'].list.len().sum()} response tokens, "
          f"mini-batches of {args.mini_batch_size}, {args.micro_batch_tokens} tokens (bucketed) or "
          f"{args.micro_batch_rows} rows (padded) per micro-batch\n")
    print("| model | training | checkpointing | batching | tokens/s | padding share | seconds | peak memory (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for shape in args.shape:
        with tempfile.TemporaryDirectory(prefix=f"mage-{shape}-") as scratch:
            if shape == "saved":
                model_dir, lora, training = args.tokenizer, None, "full"
            else:
                model_dir = Path(scratch)
                save_random_model(shape, args.tokenizer, model_dir, args.device, args.dtype)
                lora = preset_lora(shape)
                training = f"LoRA r={lora.r}"
            for checkpointing in args.gradient_checkpointing:
                for batching in args.batching:
                    m = measure(model_dir, table, batching, checkpointing == "on", args, lora)
                    row = f"| {shape} | {training} | {checkpointing} | {batching} |"
                    if m is None:
                        print(f"{row} out of GPU memory | | | |", flush=True)
                        continue
                    # peak_memory_mib: on a GPU the allocator's peak of this update; on a CPU the
                    # process's peak RSS so far
                    results.append({"model": shape, "checkpointing": checkpointing, "batching": batching, **m})
                    print(f"{row} {m['tokens_per_second']:.0f} | {100 * m['padding_share']:.1f}% | "
                          f"{m['seconds']:.2f} | {m['peak_memory_mib']:.0f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
