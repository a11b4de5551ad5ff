"""Regrouping in the ``hf`` backend: a built tiny warm start's check (``preset.json``'s
evaluation-style rollouts against every training and held-out opponent) with the rows left
running regrouped into smaller batches, against one ``generate`` call per micro-batch.

Both settings run in one process, alternating, ``--repeats`` times each, on the same model
and the same planned meta-episodes; the sampled draws differ, so the win rates agree only
within noise. Decoded rows x steps counts the work each setting's decode steps did. A second
table times one decode step against the number of rows (play prompts of the check, every row
forced to the token limit), which is what regrouping trades on.

    python benchmarks/regroup.py --model-dir artifacts/models/tiny-tic_tac_toe --game tic_tac_toe

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--game", required=True, choices=["kuhn_poker", "tic_tac_toe", "sokoban"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="more settings, as `key=value`")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mage.backends.hf import HFBackend
    from mage.settings import load_settings
    from mage.warmstart.preset import population_manifest, warm_start_check

    torch.set_num_threads(args.threads)
    settings = load_settings([f"game={args.game}", *args.overrides])
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    manifest = population_manifest(settings)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    play_rows: list[list[int]] = []  # the largest play micro-batch seen, for the step-cost table
    for _ in range(args.repeats):
        for regroup in (False, True):
            backend = HFBackend(model, tokenizer, chat=settings.model.chat, regroup=regroup)
            work = {"calls": 0, "row_steps": 0, "steps": 0}
            decode = backend._decode

            def counted(rows, opened, sampling, phase, spent, pause_rows, decode=decode, work=work):
                if phase == "play" and spent == 0 and len(rows) > len(play_rows):
                    play_rows[:] = rows
                tokens, logprobs, ended, paused = decode(rows, opened, sampling, phase, spent, pause_rows)
                steps = max(len(t) for t in tokens)
                work["calls"] += 1
                work["steps"] += steps
                work["row_steps"] += steps * len(rows)
                return tokens, logprobs, ended, paused

            backend._decode = counted
            start = time.perf_counter()
            check = warm_start_check(model, tokenizer, settings, manifest, progress=False, backend=backend)
            seconds = time.perf_counter() - start
            runs[regroup].append({"seconds": seconds, **work,
                                  "train": check["train"]["all"]["final_win_rate"],
                                  "held_out": check["held_out"]["all"]["final_win_rate"]})

    print(f"{platform.processor() or platform.machine()}, {args.threads} torch threads; {args.game}, "
          f"{settings.model.tiny.check_meta_episodes} meta-episodes per split, {args.repeats} runs each, alternating\n")
    print("| micro-batches | check, s (median) | generate calls | decode steps | rows x steps | final win, train | final win, held out |")
    print("|---|---|---|---|---|---|---|")
    for regroup in (False, True):
        rows = runs[regroup]
        median = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        name = "regrouped" if regroup else "one call each"

        def each(key: str, digits: int, rows=rows) -> str:
            return ", ".join(f"{r[key]:.{digits}f}" for r in rows)

        print(f"| {name} | {median['seconds']:.1f} ({each('seconds', 1)}) | {median['calls']:.0f} | "
              f"{median['steps']:.0f} | {median['row_steps']:.0f} | {each('train', 3)} | {each('held_out', 3)} |")
    ratio = statistics.median(r["seconds"] for r in runs[False]) / statistics.median(r["seconds"] for r in runs[True])
    print(f"\nregrouped is {ratio:.2f}x as fast\n")
    step_cost(HFBackend(model, tokenizer, chat=settings.model.chat, regroup=False), play_rows,
              settings.model.tiny.check_sampling)


def step_cost(backend, rows: list[list[int]], sampling) -> None:
    """Milliseconds per decode step against the rows decoding, every row forced to the limit."""
    from dataclasses import replace

    plain = backend._generation_config

    def forced(sampling, max_new_tokens):  # no end of sequence before the limit
        config = plain(sampling, max_new_tokens)
        config.min_new_tokens = max_new_tokens
        return config

    backend._generation_config = forced
    sampling = replace(sampling, stop=())
    print(f"| rows decoding | ms per decode step ({sampling.max_new_tokens} steps, prompts of {len(rows[0])}+ tokens, the prefill included) |")
    print("|---|---|")
    for count in (64, 16, 4, 1):
        batch = rows[:count]
        if len(batch) < count:
            continue
        backend._generate_batch(batch, sampling, "play")  # warm
        start = time.perf_counter()
        backend._generate_batch(batch, sampling, "play")
        print(f"| {count} | {1000 * (time.perf_counter() - start) / sampling.max_new_tokens:.1f} |")


if __name__ == "__main__":
    main()
