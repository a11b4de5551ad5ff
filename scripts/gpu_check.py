"""The GPU check (``scripts/gpu_check.sh`` runs it): what a single GPU does with this pipeline
at a real model's shape, in one JSON for BENCHMARKS.md. Random weights at the real
vocabulary stand in for the hub's (the GPU machine has no network); the tokenizer is the
tiny preset's kind, trained here on the games' text (ids it does not know decode to nothing).

Steps, each timed, each recorded even when it fails:

1. ``gpu_tests``: the GPU-marked tests (``pytest -m gpu``).
2. ``training``: 2 iterations of ``model=qwen2_5_0_5b`` (LoRA r=32) on Kuhn Poker, 4 groups of 4, the hf
   backend generating on the GPU; seconds per iteration, the update's peak memory, and the
   memory plan's estimate of it (``mage.preflight.memory_plan``).
3. ``memory_sweep``: ``benchmarks/train_memory.py`` at Qwen3-4B's shape, LoRA r=64, gradient
   checkpointing, bf16: the update's peak with chunked logits against whole logits, at replies
   of 256, 1,024 and 3,072 tokens.
4. ``bf16_full_fine_tuning``: one update at lr 1e-6 of a Qwen2.5-0.5B-shaped model, computing
   in bf16 with float32 master weights: the share of weights that moved, and the distance to
   the same update computed in float32.
5. ``update_speed``: the update's tokens/s on Qwen3-4B + LoRA r=64 (checkpointed, bf16) and
   its model FLOPs utilisation: the update's FLOPs (2N per token for each of the two scoring
   passes, 6N per PPO epoch, prompts included, checkpointing's recomputation not counted)
   per second over the GPU's dense bf16 peak.

``--dry-run`` runs the same steps at toy sizes on the CPU (what ``tests/test_gpu_check.py``
runs in CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
TOY = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=8192)
#: Dense bf16 peak of the GPUs this has run on (NVIDIA's data sheets, SXM parts), FLOP/s.
BF16_PEAK = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def shape_of(hub_id: str, dry: bool) -> dict:
    from mage.models.shapes import SHAPES

    return TOY if dry else SHAPES[hub_id]


def save_random_model(directory: Path, shape: dict, device: str, dtype: str) -> Path:
    """A random model of ``shape`` with a tokenizer trained on the games' text, saved."""
    import torch

    from mage.models.shapes import random_causal_lm
    from mage.settings import load_settings
    from mage.warmstart.preset import corpus
    from mage.warmstart.tiny import train_tokenizer

    build = dataclasses.replace(load_settings().model.tiny, corpus_meta_episodes=8)
    tokenizer = train_tokenizer(corpus(build, progress=False), vocab_size=1024)
    model = random_causal_lm(shape, getattr(torch, dtype), device, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def gpu_test_files() -> list[str]:
    """The test modules with GPU-marked tests. Only these are collected: the other modules import
    what a GPU machine without a registry lacks (Prefect, Ray, DVC), and one collection error
    stops pytest before any test runs."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in path.read_text())


def gpu_tests(args) -> dict:
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider",
                           *gpu_test_files()], cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    summary = [line for line in lines if " in " in line and any(word in line for word in ("passed", "skipped",
                                                                                        "failed", "error"))]
    if done.returncode != 0:
        raise RuntimeError(f"pytest exited {done.returncode}: " + "\n".join(lines[-40:]) + done.stderr[-2000:])
    return {"returncode": done.returncode, "summary": summary[-1] if summary else done.stdout[-500:]}


def training(args) -> dict:
    from mage.preflight.memory_plan import plan
    from mage.run import RunLayout, train
    from mage.settings import load_settings

    with tempfile.TemporaryDirectory(prefix="mage-gpu-check-") as scratch:
        model_dir = save_random_model(Path(scratch) / "model", shape_of("Qwen/Qwen2.5-0.5B-Instruct", args.dry_run),
                                      args.device, args.dtype)
        settings = load_settings([
            "model=qwen2_5_0_5b", f"model.path={model_dir}", "model.local_dir=null", "model.name=gpu-check",
            f"model.device={args.device}", f"model.dtype={args.dtype}", "train.iterations=2",
            "engine.groups=2" if args.dry_run else "engine.groups=4", "engine.group_size=2" if args.dry_run else
            "engine.group_size=4", f"engine.sampling.max_new_tokens={16 if args.dry_run else 256}",
            "eval.meta_episodes=2", f"paths.artifacts={scratch}/artifacts", f"paths.results={scratch}/results",
            "paths.live=null",
        ])
        started = time.perf_counter()
        result = train(settings, progress=False)
        seconds = time.perf_counter() - started
        performance = [json.loads(line) for line in RunLayout.of(settings).performance.read_text().splitlines()]
        estimate = plan(settings, None, args.device)
        return {"iterations": result.iterations, "seconds": round(seconds, 1), "performance": performance,
                "planned_update_peak_gib": round(estimate.total("update") / 2**30, 2)}


def memory_sweep(args) -> dict:
    command = [sys.executable, str(ROOT / "benchmarks" / "train_memory.py"), "--device", args.device]
    if args.dry_run:
        # one length, both paths, no tokens/s rounds: each measurement is a fresh process (an
        # import of torch and transformers), and the dry run checks only that the sweep runs
        command += ["--lengths", "128", "--chunk", "32", "--repeats", "1", "--speed-rounds", "0"]
    else:
        command += ["--shape", "Qwen/Qwen3-4B", "--lora", "64", "--gradient-checkpointing", "--dtype", "bfloat16",
                    "--rows", "6", "--repeats", "2", "--speed-rounds", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return {"table": done.stdout.strip().splitlines()[:-1], **json.loads(done.stdout.strip().splitlines()[-1])}


def bf16_full_fine_tuning(args) -> dict:
    """One update of a full model at lr 1e-6, computing in bf16 (on the CPU too) against float32."""
    import torch

    from mage.models.policy import as_policy
    from mage.models.shapes import random_causal_lm, random_update_table
    from mage.settings import load_settings
    from mage.trainer.policy_trainer import PolicyTrainer

    defaults = load_settings(["model=qwen2_5_0_5b", "model.lora=null"])  # its trainer: chunked logits
    shape = shape_of("Qwen/Qwen2.5-0.5B-Instruct", args.dry_run)
    table = random_update_table(8, 64, 128, shape["vocab_size"])
    cfg = dataclasses.replace(defaults.train, learning_rate=1e-6, mini_batch_size=8, gradient_checkpointing=False)

    def updated(dtype: str) -> list:
        model = random_causal_lm(shape, torch.float32, args.device)  # float32 master weights
        policy = as_policy(model, SimpleNamespace(pad_token_id=0), "random", dtype=dtype)
        trainer = PolicyTrainer(policy, cfg, defaults.algo)
        before = [p.detach().clone() for p in trainer.parameters]
        trainer.update(table, seed=0)
        return [(b, p.detach()) for b, p in zip(before, trainer.parameters)]

    low, reference = updated("bfloat16"), updated("float32")
    moved = sum(int((after != before).sum()) for before, after in low)
    total = sum(before.numel() for before, _ in low)
    step = torch.cat([(a - b).flatten() for b, a in low])
    step32 = torch.cat([(a - b).flatten() for b, a in reference])
    return {"logits_chunk_tokens": cfg.logits_chunk_tokens, "parameters": total, "moved_share": moved / total,
            "step_relative_distance": float((step - step32).norm() / step32.norm()),
            "step_cosine": float(torch.nn.functional.cosine_similarity(step, step32, dim=0))}


def update_speed(args) -> dict:
    import torch

    from mage.config.sections import LoraSection
    from mage.models.policy import as_policy
    from mage.models.shapes import random_causal_lm, random_update_table
    from mage.settings import load_settings
    from mage.trainer.policy_trainer import PolicyTrainer

    defaults = load_settings(["model=qwen3_4b"])
    shape = shape_of("Qwen/Qwen3-4B", args.dry_run)
    lora = LoraSection(r=64, alpha=128, dropout=0.0, target_modules=defaults.model.lora.target_modules)
    model = random_causal_lm(shape, getattr(torch, args.dtype), args.device)
    parameters = sum(p.numel() for p in model.parameters())
    policy = as_policy(model, SimpleNamespace(pad_token_id=0), "random", dtype=args.dtype, lora=lora)
    rows, reply = (4, 64) if args.dry_run else (32, 1024)
    cfg = dataclasses.replace(defaults.train, mini_batch_size=rows // 2)
    table = random_update_table(rows, 256, reply, shape["vocab_size"])
    trainer = PolicyTrainer(policy, cfg, defaults.algo)
    trainer.update(table.head(2), seed=1)  # warm-up
    metrics = trainer.update(table, seed=0)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    peak = next((flops for key, flops in BF16_PEAK.items() if key in name), None)
    # the old and the reference log-probs: a forward pass each (2N per token); each PPO epoch a
    # forward and a backward pass (6N); prompts included, the checkpointed recomputation not
    flops = (2 * 2 + 6 * cfg.ppo_epochs) * parameters * rows * (256 + reply)
    flops_per_second = flops / metrics["seconds"]
    return {"device": name, "tokens_per_second": metrics["tokens_per_second"], "seconds": metrics["seconds"],
            "peak_memory_mib": metrics["peak_memory_mib"], "parameters": parameters,
            "mfu": flops_per_second / peak if peak and args.dtype == "bfloat16" else None}


STEPS = {"gpu_tests": gpu_tests, "training": training, "memory_sweep": memory_sweep,
         "bf16_full_fine_tuning": bf16_full_fine_tuning, "update_speed": update_speed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the same steps at toy sizes on the CPU")
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--output", type=Path, default=Path("gpu_check.json"))
    args = parser.parse_args()
    args.device, args.dtype = ("cpu", "float32") if args.dry_run else ("cuda", "bfloat16")
    import torch

    report = {"date": time.strftime("%Y-%m-%d"), "dry_run": args.dry_run, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "steps": {}}
    for name in args.steps:
        started = time.perf_counter()
        print(f"gpu check: {name} ...", flush=True)
        try:
            outcome = {"ok": True, **STEPS[name](args)}
        except Exception as error:  # one step's failure is recorded and the others still run
            outcome = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
        outcome["wall_seconds"] = round(time.perf_counter() - started, 1)
        report["steps"][name] = outcome
        print(f"gpu check: {name} {'ok' if outcome['ok'] else 'FAILED: ' + outcome['error']} "
              f"({outcome['wall_seconds']} s)", flush=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")  # what has run so far survives a kill
    print(f"gpu check: {args.output}")
    sys.exit(0 if all(step["ok"] for step in report["steps"].values()) else 1)


if __name__ == "__main__":
    main()
