"""benchmarks/update_direction.py, on a run of one update made here.

The update is one PPO step on two prompts, each with a reply of advantage +1 and one of -1
(test_trainer.fixed_batch). To first order such a step raises the +1 replies and lowers the
-1 ones, which the script must report; its log-probabilities must equal a plain
teacher-forced forward pass of the same weights (a second implementation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from transformers import AutoModelForCausalLM

from mage.algo import AlgoConfig
from mage.models.policy import load_policy
from mage.train.config import TrainConfig
from mage.train.trainer import PolicyTrainer
from tests.test_trainer import fixed_batch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import update_direction  # noqa: E402


def plain_logprob(model_dir: Path, prompt: list[int], response: list[int]) -> float:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return sum(float(logprobs[len(prompt) - 1 + t, token]) for t, token in enumerate(response))


def test_one_update_raises_the_positive_replies_and_lowers_the_negative(tiny_model_dir, tmp_path):
    policy = load_policy(tiny_model_dir)
    table = fixed_batch(policy).with_columns(pl.lit("play").alias("phase"))
    trainer = PolicyTrainer(policy, TrainConfig(learning_rate=1e-3, mini_batch_size=64), AlgoConfig(kl_coef=0.0, entropy_coef=0.0))
    trainer.update(table, seed=0)
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "ckpt-00001"
    policy.model.save_pretrained(checkpoint)
    policy.tokenizer.save_pretrained(checkpoint)
    (checkpoint / "manifest.json").write_text(json.dumps({"base_model": str(tiny_model_dir)}))
    (run / "rollouts").mkdir()
    table.write_parquet(run / "rollouts" / "iteration-00001.parquet")

    before = update_direction.response_logprobs(tiny_model_dir, table)
    after = update_direction.response_logprobs(checkpoint, table)
    plain_change = []
    for i, row in enumerate(table.iter_rows(named=True)):
        plain_before = plain_logprob(tiny_model_dir, row["prompt_token_ids"], row["response_token_ids"])
        plain_after = plain_logprob(checkpoint, row["prompt_token_ids"], row["response_token_ids"])
        assert (before[i], after[i]) == pytest.approx((plain_before, plain_after), abs=1e-4)
        plain_change.append(plain_after - plain_before)
    unchanged = update_direction.direction(table, before, before)[0]
    assert (unchanged["dlogp A>0.5"], unchanged["dlogp A<-0.5"], unchanged["logp fell"]) == (0.0, 0.0, 0.0)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_direction.py"), str(run), "--updates", "1",
                           "--threads", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| 1 | all |")]
    assert len(lines) == 1, done.stdout
    cells = [cell.strip() for cell in lines[0].strip("|").split("|")]
    header = [cell.strip() for cell in next(l for l in done.stdout.splitlines() if l.startswith("| update")).strip("|").split("|")]
    row = dict(zip(header, cells))
    assert (row["calls"], row["A>0.5"], row["A<-0.5"]) == ("4", "2", "2")
    assert float(row["dlogp A>0.5"]) > 0 > float(row["dlogp A<-0.5"])
    assert float(row["corr(dlogp, A)"]) > 0
    assert float(row["logp fell"]) == 0.5
    assert float(row["KL(old, new)"]) == pytest.approx(-sum(plain_change) / 4, abs=2e-3)  # printed to 3 decimals
