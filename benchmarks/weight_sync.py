"""Weights to the vLLM engine: the time from the end of an update to the engine serving the new
weights, through disk against through memory (issue 50).

* disk: the checkpoint the loop writes (weights, optimizer and RNG state), then the backend's
  load path (``load_checkpoint``; a GPU reloads in place, a CPU restarts the engine), until a
  one-token request is answered with the new weights;
* memory: :func:`mage.backends.vllm_sync.push_weights` of the trainer's ``state_dict``, then the
  check (:func:`~mage.backends.vllm_sync.verify`: the engine's and the trainer's log-probs of the
  probe), which is when the engine has served the new weights.

One engine, one policy and its trainer; every repeat makes a real update (``PolicyTrainer.update``
on a random table, not timed) before each sync, and the two ways alternate (AB, then BA, ...).
The model is a built model directory (``--model``, e.g. the tiny preset's
``artifacts/models/tiny-kuhn_poker``) or, by default, a random model of the tiny preset's shape
(``params/model/tiny.yaml``) with a tokenizer trained on scripted game text.

    python benchmarks/weight_sync.py --repeats 5

Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path


def build_tiny_shaped(directory: Path, **shape: int) -> Path:
    """A random model of the tiny preset's shape (``shape``: another hidden_size, num_layers,
    num_heads, num_kv_heads or intermediate_size) and a tokenizer trained on scripted Kuhn text."""
    from mage.backends.scripted import ScriptedBackend
    from mage.config.sections import RolloutSection, SamplingSection
    from mage.rollout import RolloutEngine, plan_meta_episodes
    from mage.settings import load_settings
    from mage.warmstart.tiny import random_model, train_tokenizer

    settings = load_settings(["game=kuhn_poker"])
    tiny = settings.model.tiny
    entries = list(settings.population.train.values())
    rollout = RolloutSection(episodes=3, group_size=2, early_stop=True, context_mode="reflection_only",
                            same_initial_state=True, max_prompt_tokens=4096, prompt_overflow="drop_oldest",
                            concurrency=None)
    sampling = SamplingSection(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=256, stop=None, seed=None)
    table = RolloutEngine(ScriptedBackend("random", seed=0), rollout, settings.game.params).run(
        plan_meta_episodes(entries, num_groups=tiny.corpus_meta_episodes // 2, group_size=2, seed=0), sampling,
        progress=False)
    tokenizer = train_tokenizer(table["prompt"].to_list() + table["response"].to_list(), vocab_size=tiny.vocab_size)
    model = random_model(tokenizer, **({"hidden_size": tiny.hidden_size, "num_layers": tiny.num_layers,
                                        "num_heads": tiny.num_heads, "num_kv_heads": tiny.num_kv_heads,
                                        "intermediate_size": tiny.intermediate_size} | shape),
                         max_position_embeddings=tiny.max_position_embeddings)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a model directory (default: a random model of the tiny shape)")
    parser.add_argument("--repeats", type=int, default=5, help="syncs of each way")
    parser.add_argument("--rows", type=int, default=8, help="rows of the random update table")
    args = parser.parse_args()

    import dataclasses

    import torch

    from mage.backends import GenerationRequest, vllm_sync, weight_sync
    from mage.backends.vllm import VLLMBackend, shutdown_engine
    from mage.config.sections import SamplingSection
    from mage.models import checkpoint as ckpt
    from mage.models.policy import load_policy
    from mage.models.shapes import random_update_table
    from mage.run.state import probe_logprobs
    from mage.settings import load_settings
    from mage.trainer.policy_trainer import PolicyTrainer

    work = Path(tempfile.mkdtemp(prefix="mage-weight-sync-"))
    model_dir = args.model or build_tiny_shaped(work / "model")
    settings = load_settings([f"model.path={model_dir}", "model.build=null"])
    policy = load_policy(str(model_dir), dtype="float32", device="cpu")
    trainer = PolicyTrainer(policy, dataclasses.replace(settings.train, mini_batch_size=args.rows), settings.algo)
    vocab = len(policy.tokenizer)
    table = random_update_table(args.rows, 64, 16, vocab)
    probe = weight_sync.probe_from(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list())
    backend = VLLMBackend(model_dir, dtype="float32", max_model_len=1024, enforce_eager=True)
    one_token = SamplingSection(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1, stop=None, seed=0)

    def answer() -> None:  # a request through the backend's load path: the engine serves the weights it names
        backend.generate([GenerationRequest("Your card: King (K).")], one_token)

    timings: dict[str, list[dict[str, float]]] = {"disk": [], "memory": []}
    gaps = []
    iteration = 0
    for repeat in range(args.repeats):
        for way in (("disk", "memory") if repeat % 2 == 0 else ("memory", "disk")):
            iteration += 1
            trainer.update(table, seed=iteration)
            started = time.perf_counter()
            if way == "disk":
                saved = ckpt.save_checkpoint(work / "checkpoints", iteration, policy, trainer.optimizer,
                                             config_hash="benchmark", parent=None, metrics={})
                written = time.perf_counter()
                backend.load_checkpoint(saved.path, saved.kind)
                answer()
                done = time.perf_counter()
                parts = {"write": written - started, "load": done - written}
                # not timed: the disk path served what the trainer holds
                gaps.append(weight_sync.largest_gap(vllm_sync.served_logprobs(backend, probe),
                                                  probe_logprobs(policy, probe))[0])
            else:
                vllm_sync.push_weights(backend, policy.model.state_dict().items())
                moved = time.perf_counter()
                gap = vllm_sync.verify(backend, probe, probe_logprobs(policy, probe), weight_sync.tolerance_for("float32"))
                done = time.perf_counter()
                parts = {"push": moved - started, "verify": done - moved}
                gaps.append(gap)
            timings[way].append({"total": done - started, **parts})
            print(f"repeat {repeat + 1} {way}: {done - started:.3f} s " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()),
                  flush=True)
    shutdown_engine()

    weights = sum(t.numel() for t in policy.model.state_dict().values())
    print(f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; model {model_dir} "
          f"({weights:,} weights with the tied head counted twice, vocabulary {vocab}); {args.repeats} syncs each\n")
    print("| way | median (s) | min (s) | max (s) | parts, median (s) |")
    print("|---|---|---|---|---|")
    summary = {}
    for way, rows in timings.items():
        totals = [r["total"] for r in rows]
        parts = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "total"}
        summary[way] = {"median": statistics.median(totals), "min": min(totals), "max": max(totals), **parts}
        print(f"| {way} | {summary[way]['median']:.3f} | {min(totals):.3f} | {max(totals):.3f} | "
              + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + " |")
    ratio = summary["disk"]["median"] / summary["memory"]["median"]
    print(f"\nmemory is {ratio:.1f} times as fast; largest probe gap after any sync {max(gaps):.1e}")
    print(json.dumps({"benchmark": "weight_sync", "repeats": args.repeats, "model": str(model_dir), "weights": weights,
                      "vocab": vocab, "disk": summary["disk"], "memory": summary["memory"], "ratio": ratio,
                      "largest_gap": max(gaps)}))


if __name__ == "__main__":
    main()
