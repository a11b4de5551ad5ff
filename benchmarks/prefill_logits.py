"""Prefill with and without ``logits_to_keep=1`` (issue 17): time and peak memory.

The hf backend prefills a batch of prompts to fill the KV cache; only the last position's
logits are ever read. Without ``logits_to_keep`` the model materialises a [prompts, tokens,
vocab] tensor. Each mode runs in its own subprocess (peak RSS is per process), on a random
Qwen2-architecture model of the tiny preset's size with the given vocabulary: 4096 (the
tiny preset's) and 151936 (Qwen's), side by side in one invocation.

    python benchmarks/prefill_logits.py                    # both vocabularies, 8 prompts x 600 tokens
    python benchmarks/prefill_logits.py --prompts 16 --tokens 600 --vocab 151936
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def measure(vocab: int, prompts: int, tokens: int, keep: bool, repeats: int) -> dict[str, float]:
    import torch
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=384, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, vocab, (prompts, tokens))
    extra = {"logits_to_keep": 1} if keep else {}
    before, seconds = rss_mib(), []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            out = model(input_ids=ids, past_key_values=DynamicCache(config=config), use_cache=True, **extra)
            seconds.append(time.perf_counter() - started)
            logits_shape = list(out.logits.shape)
            del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": min(seconds), "peak_over_model_mib": peak - before, "logits_shape": logits_shape}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 151936])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        vocab, keep = json.loads(args.child)
        print(json.dumps(measure(vocab, args.prompts, args.tokens, keep, args.repeats)))
        return

    print(f"prefill of {args.prompts} prompts x {args.tokens} tokens, best of {args.repeats}")
    print("| vocabulary | logits kept | logits tensor | seconds | peak RSS over the model (MiB) | time ratio | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for vocab in args.vocab:
        rows = {}
        for keep in (False, True):
            command = [sys.executable, __file__, "--prompts", str(args.prompts), "--tokens", str(args.tokens),
                       "--repeats", str(args.repeats), "--child", json.dumps([vocab, keep])]
            rows[keep] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        for keep, row in rows.items():
            ratio_t = rows[False]["seconds"] / row["seconds"]
            ratio_m = rows[False]["peak_over_model_mib"] / max(row["peak_over_model_mib"], 1e-9)
            print(f"| {vocab} | {'last (logits_to_keep=1)' if keep else 'all'} | {row['logits_shape']} "
                  f"| {row['seconds']:.3f} | {row['peak_over_model_mib']:.0f} | {ratio_t:.2f}x | {ratio_m:.1f}x |")


if __name__ == "__main__":
    main()
