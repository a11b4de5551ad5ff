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
from conftest import algo_config, train_config
from test_sokoban_benchmarks import run_script
from test_trainer import fixed_batch
from transformers import AutoModelForCausalLM

from mage.models.policy import load_policy
from mage.sections import LoraSettings
from mage.train.trainer import PolicyTrainer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import update_direction  # noqa: E402


def plain_logprobs(model_dir: Path, table: pl.DataFrame) -> list[float]:
    """Each row's summed reply log-probability, one plain forward pass a row."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sums = []
    for prompt, response in zip(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list()):
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([prompt + response])).logits[0, :-1].float(), -1)
        sums.append(sum(float(logprobs[len(prompt) - 1 + t, token]) for t, token in enumerate(response)))
    return sums


def printed_row(stdout: str, update: int, phase: str) -> dict[str, str]:
    lines = stdout.splitlines()
    header_line = next(line for line in lines if line.startswith("| update"))
    header = [cell.strip() for cell in header_line.strip("|").split("|")]
    rows = [line for line in lines if line.startswith(f"| {update} | {phase} |")]
    assert len(rows) == 1, stdout
    return dict(zip(header, [cell.strip() for cell in rows[0].strip("|").split("|")]))


def test_one_update_raises_the_positive_replies_and_lowers_the_negative(tiny_model_dir, tmp_path):
    policy = load_policy(tiny_model_dir)
    table = fixed_batch(policy).with_columns(pl.lit("play").alias("phase"))
    trainer = PolicyTrainer(policy, train_config(learning_rate=1e-3, mini_batch_size=64),
                            algo_config(kl_coef=0.0, entropy_coef=0.0))
    trainer.update(table, seed=0)
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "ckpt-00001"
    policy.model.save_pretrained(checkpoint)
    policy.tokenizer.save_pretrained(checkpoint)
    (checkpoint / "manifest.json").write_text(json.dumps({"base_model": str(tiny_model_dir), "kind": "full"}))
    (run / "rollouts").mkdir()
    table.write_parquet(run / "rollouts" / "iteration-00001.parquet")

    plain_before, plain_after = plain_logprobs(tiny_model_dir, table), plain_logprobs(checkpoint, table)
    before = update_direction.response_logprobs(update_direction.policy_at(tiny_model_dir, str(tiny_model_dir)), table)
    after = update_direction.response_logprobs(update_direction.policy_at(checkpoint, str(tiny_model_dir)), table)
    assert list(before) == pytest.approx(plain_before, abs=1e-4)
    assert list(after) == pytest.approx(plain_after, abs=1e-4)
    unchanged = update_direction.direction(table, before, before)[0]
    assert (unchanged["dlogp A>0.5"], unchanged["dlogp A<-0.5"], unchanged["logp fell"]) == (0.0, 0.0, 0.0)

    row = printed_row(run_script("update_direction.py", str(run), "--updates", "1", "--threads", "1"), 1, "all")
    change = [a - b for a, b in zip(plain_after, plain_before)]
    positive = [c for c, advantage in zip(change, table["advantage"]) if advantage > 0]
    negative = [c for c, advantage in zip(change, table["advantage"]) if advantage < 0]
    assert (row["calls"], row["A>0.5"], row["A<-0.5"]) == ("4", "2", "2")
    # printed to 3 decimals; to first order the step raises the +1 replies and lowers the -1 ones
    assert float(row["dlogp A>0.5"]) == pytest.approx(sum(positive) / 2, abs=2e-3) and min(positive) > 0
    assert float(row["dlogp A<-0.5"]) == pytest.approx(sum(negative) / 2, abs=2e-3) and max(negative) < 0
    assert float(row["corr(dlogp, A)"]) > 0 and float(row["logp fell"]) == 0.5
    assert float(row["KL(old, new)"]) == pytest.approx(-sum(change) / 4, abs=2e-3)


def test_a_lora_checkpoint_is_scored_as_its_base_model_with_the_adapter_merged(tiny_model_dir, tmp_path):
    """The LoRA branch of policy_at: the base model plus the checkpoint's adapter, scored in
    eval mode (its dropout off), must give the log-probs of peft's merged model."""
    from peft import PeftModel

    lora = LoraSettings(r=4, alpha=8, dropout=0.5, target_modules=("q_proj", "v_proj", "up_proj"))
    policy = load_policy(tiny_model_dir, lora=lora)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peft starts lora_B at 0, which would leave the base model as it is
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    checkpoint = tmp_path / "ckpt-00001"
    policy.model.save_pretrained(checkpoint)
    (checkpoint / "manifest.json").write_text(json.dumps({"base_model": str(tiny_model_dir), "kind": "lora"}))
    merged_dir = tmp_path / "merged"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload().save_pretrained(merged_dir)
    table = fixed_batch(policy)

    scored = update_direction.response_logprobs(update_direction.policy_at(checkpoint, str(tiny_model_dir)), table)
    plain_merged, plain_base = plain_logprobs(merged_dir, table), plain_logprobs(tiny_model_dir, table)
    assert list(scored) == pytest.approx(plain_merged, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(plain_merged, plain_base)) > 0.1  # the adapter does change them


def test_a_missing_checkpoint_is_named(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "benchmarks" / "update_direction.py"), str(tmp_path), "--base", "x", "--updates", "1"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "ckpt-00001" in done.stderr and "iteration-00001.parquet" in done.stderr
