"""The update on two ranks (gloo, CPU) against the same update in one process: the loss, the
gradient norm and the weights agree within 1e-5 (the ranks add the same terms in another
order), for full fine-tuning sharded with FSDP2 and LoRA sharded or replicated; the sharded
state resumes on another number of ranks, or in one process."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import polars as pl
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from mage.settings import Settings, load_settings
from mage.trainer import sharded
from mage.trainer.sharded import UpdateJob, run_update

LORA = "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj, up_proj]}"


def settings_for(model_dir: Path, tmp_path: Path, *extra: str) -> Settings:
    return load_settings([f"model.path={model_dir}", "model.build=null", "train.learning_rate=1e-3",
                          "train.mini_batch_size=6", "algo.kl_coef=0.05", "algo.entropy_coef=0.01",
                          f"paths.artifacts={tmp_path}", f"paths.results={tmp_path}/results", *extra])


def scored_table(model_dir: Path, path: Path) -> str:
    """Twelve calls of different lengths with advantages of both signs: two mini-batches of 6,
    which two ranks split unevenly by rows and evenly by tokens; their prompts share a prefix."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    # one long common prefix, as the games' prompts have: the one-process update runs it once
    rules = "Game: Kuhn Poker, two players. Each antes one chip. "
    prompts = (rules + "Your card: King (K).", rules + "Your card: Jack (J). The opponent bet.", rules + "You act first.")
    replies = ("<action>bet</action>", "<action>check</action> then <remark>the opponent folds often</remark>",
               "<action>call</action>", "<remark>bluff less</remark><action>fold</action>")
    for i, (prompt, reply) in enumerate((p, r) for p in prompts for r in replies):
        rows.append({"prompt_token_ids": encode(prompt), "response_token_ids": encode(reply),
                     "advantage": (1.0 if i % 3 else -1.5) * (1 + i / 10)})
    schema = {"prompt_token_ids": pl.List(pl.Int64), "response_token_ids": pl.List(pl.Int64), "advantage": pl.Float64}
    pl.DataFrame(rows, schema=schema).write_parquet(path)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, job: UpdateJob) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        metrics = run_update(job)
        if rank == 0:
            (Path(job.out) / "metrics.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def on_ranks(world: int, job: UpdateJob) -> dict[str, float]:
    mp.spawn(_rank, args=(world, _free_port(), job), nprocs=world, join=True)
    return json.loads((Path(job.out) / "metrics.json").read_text())


def job(settings: Settings, table: str, out: Path, resume: Path | None = None, seed: int = 3) -> UpdateJob:
    out.mkdir(parents=True, exist_ok=True)
    return UpdateJob(settings, 1, table, str(resume) if resume else None, str(out), seed, 1e-3)


def trained(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / sharded.WEIGHTS)


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tolerance: float = 1e-5) -> None:
    assert a.keys() == b.keys() and a
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    typical = max(float((a[k] - b[k]).abs().mean()) for k in a)
    assert worst <= tolerance and typical <= tolerance / 10, (worst, typical)


@pytest.mark.parametrize("extra", [("train.sharding=fsdp",), ("train.sharding=fsdp", LORA), ("train.sharding=ddp", LORA)],
                         ids=["full-fsdp", "lora-fsdp", "lora-ddp"])
def test_two_ranks_update_as_one_process(tiny_model_dir, tmp_path, extra):
    settings = settings_for(tiny_model_dir, tmp_path, *extra)
    table = scored_table(tiny_model_dir, tmp_path / "table.parquet")
    alone = run_update(job(settings, table, tmp_path / "one"))
    shared = on_ranks(2, job(settings, table, tmp_path / "two"))
    assert alone["optimizer_steps"] == shared["optimizer_steps"] == 2
    assert alone["tokens"] == shared["tokens"]
    for key in ("loss", "grad_norm", "policy_loss", "kl", "entropy"):
        assert shared[key] == pytest.approx(alone[key], abs=1e-5), key
    before = load_file(next(tiny_model_dir.glob("*.safetensors")))
    one, two = trained(tmp_path / "one"), trained(tmp_path / "two")
    assert_close(one, two)
    if "lora" not in "".join(extra):  # the update moved the weights
        assert any(not torch.allclose(one[k], before[k]) for k in before if k in one)


@pytest.mark.e2e
def test_the_sharded_state_resumes_on_another_number_of_ranks(tiny_model_dir, tmp_path):
    """Two ranks write the state; one process and three ranks each continue it with a second
    update; both equal one process that ran the two updates (within 1e-5); the sharded state is
    safetensors files only (nothing to unpickle)."""
    settings = settings_for(tiny_model_dir, tmp_path)
    table = scored_table(tiny_model_dir, tmp_path / "table.parquet")
    on_ranks(2, job(settings, table, tmp_path / "first"))
    state = tmp_path / "first" / sharded.SHARDED_STATE
    assert {p.suffix for p in state.iterdir() if p.is_file()} == {".safetensors"}

    run_update(job(settings, table, tmp_path / "alone-1"))
    alone = run_update(job(settings, table, tmp_path / "alone-2", resume=tmp_path / "alone-1", seed=4))
    one = run_update(job(settings, table, tmp_path / "one", resume=tmp_path / "first", seed=4))
    three = on_ranks(3, job(settings, table, tmp_path / "three", resume=tmp_path / "first", seed=4))
    # the second update's KL is to the starting weights, which the ranks swap into their shards
    # (an FSDP2 root that kept its gathered weights would score the reference with the current ones)
    assert alone["kl"] > 1e-4
    for resumed in (one, three):
        assert resumed["kl"] == pytest.approx(alone["kl"], rel=1e-3)
        assert resumed["loss"] == pytest.approx(alone["loss"], abs=1e-5)
    # Four AdamW steps: a step divides by the weight's own gradient size, so where a gradient is
    # near zero the ranks' other order of summation moves it by up to a fraction of lr (1e-3)
    assert_close(trained(tmp_path / "alone-2"), trained(tmp_path / "one"), tolerance=1e-4)
    assert_close(trained(tmp_path / "alone-2"), trained(tmp_path / "three"), tolerance=1e-4)
    # and the second update moved them
    assert not all(torch.equal(trained(tmp_path / "first")[k], trained(tmp_path / "one")[k])
                   for k in trained(tmp_path / "first"))


def test_a_one_process_checkpoint_is_refused_on_workers_naming_the_key(tiny_model_dir, tmp_path):
    """A run checkpointed by one process (``trainer_state.safetensors``) is not continued on
    workers: the update says so before any work, naming train.workers."""
    from mage.models import checkpoint as ckpt
    from mage.models.policy import load_run_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    settings = settings_for(tiny_model_dir, tmp_path)
    table = scored_table(tiny_model_dir, tmp_path / "table.parquet")
    policy = load_run_policy(settings)
    trainer = PolicyTrainer(policy, settings.train, settings.algo)
    saved = ckpt.save_checkpoint(tmp_path / "checkpoints", 1, policy, trainer.optimizer, config_hash="h", parent=None,
                                 metrics={})
    with pytest.raises(ValueError, match=r"^train.workers: .* was written by one process"):
        run_update(job(settings, table, tmp_path / "next", resume=saved.path))


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [(), (LORA,)], ids=["full", "lora"])
def test_a_one_process_checkpoint_continues_on_two_ranks_as_in_one_process(tiny_model_dir, tmp_path, extra):
    """A run checkpointed by one process (``trainer_state.safetensors``) resumed with
    train.workers=2: the driver (start_training) writes a sharded state from the checkpoint, and
    two ranks' update from it equals one process continuing the checkpoint itself (within 1e-4:
    three AdamW steps, two of them from the checkpoint's moments); the checkpoint's weights and
    moments are what the ranks start from, not the base model's."""
    from mage.models import checkpoint as ckpt
    from mage.run.state import start_training

    table = scored_table(tiny_model_dir, tmp_path / "table.parquet")
    one = settings_for(tiny_model_dir, tmp_path, *extra)
    first = start_training(one)
    first.trainer.update(pl.read_parquet(table), seed=3, learning_rate=1e-3)
    saved = ckpt.save_checkpoint(tmp_path / "checkpoints", 1, first.policy, first.trainer.optimizer,
                                 config_hash="h", parent=None, metrics={})
    assert not saved.sharded

    alone = start_training(one, saved)
    alone_metrics = alone.trainer.update(pl.read_parquet(table), seed=4, learning_rate=1e-3)
    expected = {name: p.detach().clone() for name, p in alone.policy.model.named_parameters() if p.requires_grad}

    workers = settings_for(tiny_model_dir, tmp_path, *extra, "flow.runner=ray", "train.workers=2",
                           "train.checkpoint_every=1")
    driver = start_training(workers, saved)
    assert driver.workers_resume is not None and (driver.workers_resume / sharded.SHARDED_STATE).is_dir()
    shared = on_ranks(2, job(workers, table, tmp_path / "two", resume=driver.workers_resume, seed=4))
    assert shared["loss"] == pytest.approx(alone_metrics["loss"], abs=1e-5)
    assert shared["kl"] == pytest.approx(alone_metrics["kl"], rel=1e-3) and alone_metrics["kl"] > 0
    assert_close(expected, trained(tmp_path / "two"), tolerance=1e-4)
    # from the base model instead, the same update lands elsewhere: the checkpoint was read
    fresh = on_ranks(2, job(workers, table, tmp_path / "fresh", seed=4))
    assert fresh["kl"] != pytest.approx(alone_metrics["kl"], rel=1e-3)
