"""Where did a run's policy updates go? (issue 15, item 3)

Update k of a run takes checkpoint k-1 (the warm start for k = 1) to checkpoint k on
iteration k's rollout table, which checkpoint k-1 sampled. For every call of that table this
script scores the response's log-probability under both, and prints, per update and phase,
the mean change of log p for the calls with a positive advantage (A > 0.5), a small one and a
negative one (A < -0.5), the correlation of the change with A, the share of calls whose
log p fell, and the update's mean entropy as the trainer logged it.

Read the groups against each other, not against 0. The calls were sampled from checkpoint
k-1, so the mean change over all of them estimates -KL(checkpoint k-1 || checkpoint k), which
is negative for any change of the policy: on average the sampled replies lose probability,
whatever the advantages say (printed as `KL(old, new)`, per call; the identity needs the
rollouts sampled without top-p or top-k, as training samples, and ``--temperature`` set to
theirs). A is the table's ``advantage``, as the trainer used it (after
``algo.negative_weight``). Calls without reply tokens are left out, as the trainer leaves them
out.

The sums are over a reply's tokens, so long replies have more to gain or lose; the invalid
and overlong ones carry the penalties and sit in the negative group. An update that follows its
advantages raises the first group against the middle one and lowers the last; length alone
gives some such order too, so compare against advantages shuffled within buckets of reply
length and validity (docs/notes/findings.md, "Self-imitation, and where the updates go").

    python benchmarks/update_direction.py <run dir> [--updates 4]

``<run dir>`` is ``paths.runs/<run name>`` (``rollouts/``, ``checkpoints/``, ``metrics.jsonl``).
The warm start is the ``base_model`` of the first checkpoint's manifest unless ``--base``.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from mage import io
from mage.models.policy import Policy, load_policy
from mage.settings import load_settings
from mage.train import checkpoint as ckpt
from mage.train.trainer import PolicyTrainer

POSITIVE, NEGATIVE = 0.5, -0.5


def policy_at(weights: str | Path, base: str) -> Policy:
    """A checkpoint's policy: a full model's directory, or the base model with a LoRA
    checkpoint's adapter (its manifest says which)."""
    if (Path(weights) / ckpt.MANIFEST).is_file() and ckpt.Checkpoint.at(weights).kind == "lora":
        return load_policy(base, device="cpu", adapter=weights)
    return load_policy(weights, device="cpu")


def response_logprobs(policy: Policy, table: pl.DataFrame, temperature: float = 1.0) -> np.ndarray:
    """Each row's summed log-probability of its response tokens under ``policy`` at the
    rollouts' sampling temperature (the trainer's own teacher-forced scoring)."""
    defaults = load_settings()  # params/'s micro-batching; no reference policy: only log p is read
    trainer = PolicyTrainer(policy, defaults.train, replace(defaults.algo, kl_coef=0.0), temperature=temperature)
    return np.array([sum(row) for row in trainer.logprobs(table)])


def direction(table: pl.DataFrame, before: np.ndarray, after: np.ndarray) -> list[dict[str, float | int | str]]:
    """Per phase (and all calls): how log p moved, by the sign of each call's advantage."""
    advantage = table["advantage"].to_numpy()
    delta = after - before
    phases = table["phase"].to_numpy()
    rows = []
    for phase in ("play", "reflect", "all"):
        keep = np.ones(len(table), bool) if phase == "all" else phases == phase
        a, d = advantage[keep], delta[keep]
        if not len(a):
            continue

        def mean(mask: np.ndarray) -> float:
            return float(d[mask].mean()) if mask.any() else float("nan")

        rows.append({
            "phase": phase, "calls": int(keep.sum()),
            f"A>{POSITIVE}": int((a > POSITIVE).sum()), f"A<{NEGATIVE}": int((a < NEGATIVE).sum()),
            f"dlogp A>{POSITIVE}": mean(a > POSITIVE),
            f"dlogp {NEGATIVE}..{POSITIVE}": mean((a >= NEGATIVE) & (a <= POSITIVE)),
            f"dlogp A<{NEGATIVE}": mean(a < NEGATIVE),
            "corr(dlogp, A)": float(np.corrcoef(a, d)[0, 1]) if a.std() > 0 and d.std() > 0 else float("nan"),
            "logp fell": float((d < 0).mean()),
            "KL(old, new)": float(-d.mean()),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run directory: rollouts/, checkpoints/, metrics.jsonl")
    parser.add_argument("--base", help="the weights update 1 started from (default: the first manifest's base_model)")
    parser.add_argument("--updates", type=int, default=4, help="the first this many updates")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the run's engine.sampling.temperature: the policy the trainer scored")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checkpoints = args.run / "checkpoints"
    base = args.base or ckpt.Checkpoint.at(checkpoints / "ckpt-00001").manifest["base_model"]
    entropy = {m.get("iteration"): m.get("train/entropy", float("nan"))
               for m in io.read_json_lines(args.run / "metrics.jsonl")}
    weights = [base, *[checkpoints / f"ckpt-{k:05d}" for k in range(1, args.updates + 1)]]
    tables = [args.run / "rollouts" / f"iteration-{k:05d}.parquet" for k in range(1, args.updates + 1)]
    missing = [str(path) for path in [*weights[1:], *tables] if not path.exists()]
    if missing:  # train.checkpoint_every > 1 keeps fewer checkpoints than iterations
        raise SystemExit(f"update_direction needs a checkpoint and a rollout table per update; missing: {missing}")
    started = time.perf_counter()
    results = []
    for k in range(1, args.updates + 1):
        table = pl.read_parquet(tables[k - 1]).filter(pl.col("response_token_ids").list.len() > 0)
        before = response_logprobs(policy_at(weights[k - 1], base), table, args.temperature)
        after = response_logprobs(policy_at(weights[k], base), table, args.temperature)
        for row in direction(table, before, after):
            results.append({"update": k, **row, "entropy": entropy.get(k, float("nan"))})
    print(f"# {platform.node()}, {torch.get_num_threads()} threads; {args.run}; from {base}; "
          f"{time.perf_counter() - started:.0f} s\n")
    header = list(results[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in results:
        print("| " + " | ".join(f"{value:+.3f}" if isinstance(value, float) and key.startswith("dlogp") else
                                f"{value:.3f}" if isinstance(value, float) else str(value)
                                for key, value in row.items()) + " |")


if __name__ == "__main__":
    main()
