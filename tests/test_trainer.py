"""The PPO loss and update, the reference policy, checkpoints and interrupt-and-resume."""

from __future__ import annotations

import math
import shutil

import polars as pl
import pytest
import torch
from conftest import algo_config, train_config

from mage.algo.losses import low_var_kl, ppo_loss
from mage.config.sections import LoraSection
from mage.models import checkpoint as ckpt
from mage.models.policy import load_policy
from mage.run import RunLayout, train
from mage.run.record import drift_warning
from mage.run.state import start_training
from mage.settings import Settings, load_settings
from mage.trainer.batching import micro_batches
from mage.trainer.policy_trainer import PolicyTrainer


def test_ppo_clip_and_dual_clip_by_hand():
    cfg = algo_config(clip_ratio=0.2, dual_clip=3.0, kl_coef=0.0, entropy_coef=0.0)
    ratios = torch.tensor([[1.5, 0.5, 1.5, 5.0, 1.1]])
    advantages = torch.tensor([1.0])
    old = torch.zeros_like(ratios)
    new = torch.log(ratios)
    # A = +1: ratio 1.5 -> max(-1.5, -1.2) = -1.2; ratio 0.5 -> max(-0.5, -0.8) = -0.5;
    # ratio 1.1 -> -1.1 (inside the clip range)
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    parts = ppo_loss(new, old, None, advantages, mask, cfg, total_tokens=3)
    assert parts.loss.item() == pytest.approx((-1.2 - 0.5 - 1.1) / 3)
    # A = -1: ratio 1.5 -> max(1.5, 1.2) = 1.5 (under the dual clip 3); ratio 5 -> min(5, 3) = 3
    mask = torch.tensor([[0, 0, 1, 1, 0]])
    parts = ppo_loss(new, old, None, -advantages, mask, cfg, total_tokens=4)  # token-mean over a bigger mini-batch
    assert parts.loss.item() == pytest.approx((1.5 + 3.0) / 4)
    assert parts.clip_fraction == pytest.approx(1.0)


def test_low_var_kl_by_hand():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    # k3 = r - log r - 1 with r = ref / pi: 0.5 - log(0.5) - 1, and 0 where equal
    assert low_var_kl(logp, ref).tolist() == pytest.approx([0.5 - math.log(0.5) - 1, 0.0])


@pytest.mark.parametrize("masked_logprob", [-100.0, -1e4, -math.inf])
def test_masked_positions_with_extreme_log_probs_leave_the_gradient_finite(masked_logprob):
    # A padded position's log-prob can be anything; the trainer fills old and reference
    # log-probs there with 0. exp(0 - (-100)) overflows float32, and 0 x inf = NaN.
    cfg = algo_config(clip_ratio=0.2, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.0)
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    real = torch.tensor([[0.0, math.log(0.5), math.log(0.25)], [math.log(0.8), math.log(0.1), 0.0]])
    old = torch.tensor([[0.0, math.log(0.4), math.log(0.25)], [math.log(0.9), math.log(0.1), 0.0]])
    ref = torch.tensor([[0.0, math.log(0.5), math.log(0.5)], [math.log(0.8), math.log(0.2), 0.0]])
    advantages = torch.tensor([1.0, -2.0])

    def loss_and_grad(fill: float):
        logprobs = torch.where(mask.bool(), real, torch.full_like(real, fill)).requires_grad_(True)
        parts = ppo_loss(logprobs, old, ref, advantages, mask, cfg, total_tokens=4)
        parts.loss.backward()
        return parts, logprobs.grad

    extreme, grad = loss_and_grad(masked_logprob)
    benign, benign_grad = loss_and_grad(0.0)
    assert torch.isfinite(grad).all() and math.isfinite(extreme.loss.item()) and math.isfinite(extreme.kl)
    assert extreme.loss.item() == pytest.approx(benign.loss.item())
    assert torch.equal(grad, benign_grad) and (grad[~mask.bool()] == 0).all()
    # By hand, row 0's second token: A = +1, ratio 0.5 / 0.4 = 1.25, clipped to 1.2 -> -1.2, and
    # k3(ref 0.5 / 0.5) = 0; KL of row 1's second token: r = 0.2 / 0.1 = 2 -> 2 - log 2 - 1.
    kl = (0.0 + (0.5 / 0.25 - math.log(0.5 / 0.25) - 1) + 0.0 + (2 - math.log(2) - 1)) / 4
    assert extreme.kl == pytest.approx(kl)


def test_bucketing_pads_less_than_fixed_batches():
    prompts = [[1] * n for n in (5, 100, 6, 98, 7, 101, 4, 99)]
    responses = [[2] * 3 for _ in prompts]
    bucketed = micro_batches(prompts, responses, 0, "bucketed", token_budget=4 * 104)
    padded = micro_batches(prompts, responses, 0, "padded", rows_per_batch=4)
    assert sorted(r for b in bucketed for r in b.rows) == list(range(8))
    assert sum(b.padded_tokens for b in bucketed) < sum(b.padded_tokens for b in padded)
    assert sum(b.real_tokens for b in bucketed) == sum(b.real_tokens for b in padded) == sum(len(p) + 3 for p in prompts)


def fixed_batch(policy) -> pl.DataFrame:
    """Two prompts, each with a response the update should favour and one it should not."""
    tokenizer = policy.tokenizer
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    for prompt in ("Your card: King (K).", "Board: A1 B2"):
        for response, advantage in (("<action>bet</action>", 1.0), ("<action>check</action>", -1.0)):
            rows.append({"prompt_token_ids": encode(prompt), "response_token_ids": encode(response), "advantage": advantage})
    return pl.DataFrame(rows, schema={"prompt_token_ids": pl.List(pl.Int64), "response_token_ids": pl.List(pl.Int64), "advantage": pl.Float64})


def sequence_logprob(trainer: PolicyTrainer, table: pl.DataFrame) -> list[float]:
    batches = micro_batches(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list(), trainer.pad_id)
    out = [0.0] * table.height
    with torch.no_grad():
        for batch in batches:
            logprobs, _ = trainer.forward(batch)
            mask = batch.response_mask.to(logprobs.device)
            for r, row in enumerate(batch.rows):
                out[row] = float((logprobs[r].float() * mask[r]).sum())
    return out


@pytest.mark.parametrize("lora", [None, LoraSection(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj", "up_proj"))])
def test_update_moves_log_probs_with_the_advantage_sign(tiny_model_dir, lora):
    policy = load_policy(tiny_model_dir, lora=lora)
    trainer = PolicyTrainer(policy, train_config(learning_rate=1e-2 if lora else 3e-3, mini_batch_size=4), algo_config())
    table = fixed_batch(policy)
    before = sequence_logprob(trainer, table)
    first = trainer.update(table, seed=0)
    # Policy equals reference before the first step: the KL term is exactly zero.
    assert first["kl"] == 0.0 and first["optimizer_steps"] == 1
    for _ in range(4):
        trainer.update(table, seed=0)
    after = sequence_logprob(trainer, table)
    for advantage, b, a in zip(table["advantage"], before, after):
        assert (a > b) if advantage > 0 else (a < b)
    # After the updates the policy differs from its reference: KL > 0.
    assert trainer.update(table, seed=1)["kl"] > 0


def test_the_full_fine_tuning_reference_is_the_starting_model_and_no_second_copy(tiny_model_dir):
    """The reference pass puts the starting weights into the model and the current ones back:
    its log-probs are the starting model's, bit for bit (a separate copy of it gives the same),
    and the trained weights are what they were. The trainer holds no module outside the policy's
    (its output layer, for the chunked log-probs, is the policy's own)."""
    policy = load_policy(tiny_model_dir)
    trainer = PolicyTrainer(policy, train_config(learning_rate=1e-2, mini_batch_size=4), algo_config())
    own = {id(m) for m in policy.model.modules()}
    # its one module of its own, the forward pass (ResponseScorer), holds the policy's weights and no others
    assert {id(v) for v in vars(trainer).values() if isinstance(v, torch.nn.Module)} - own == {id(trainer.scorer)}
    assert {id(p) for p in trainer.scorer.parameters()} == {id(p) for p in policy.model.parameters()}
    table = fixed_batch(policy)
    for _ in range(3):
        trainer.update(table, seed=0)
    trained = [p.detach().clone() for p in trainer.parameters]
    prompts, responses = table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list()
    lengths = [len(r) for r in responses]
    rows = list(range(len(lengths)))
    (reference,) = trainer._score(prompts, responses, rows, lengths, references=(True,))
    assert all(torch.equal(p, t) for p, t in zip(trainer.parameters, trained))  # put back
    starting = PolicyTrainer(load_policy(tiny_model_dir), train_config(), algo_config(kl_coef=0.0))
    (expected,) = starting._score(prompts, responses, rows, lengths, references=(False,))
    assert all(torch.equal(a, b) for a, b in zip(reference, expected))
    (current,) = trainer._score(prompts, responses, rows, lengths, references=(False,))
    assert not all(torch.equal(a, b) for a, b in zip(current, expected))


@pytest.mark.parametrize("chunk", [None, 4])
def test_bf16_full_fine_tuning_keeps_every_update_in_float32_master_weights(tiny_model_dir, chunk):
    """Full fine-tuning in bf16 at the paper's learning rate: one update moves at least 90% of
    the weights, as an update in float32 does, within what bf16 compute changes of the
    gradient. (A bf16 weight of 0.02 stepped by 1e-6 would not move: its spacing is 1.2e-4.)
    With chunked logits too: the trained (tied) output layer's bf16 gradient per chunk."""
    lr = 1e-6
    assert torch.tensor(0.02, dtype=torch.bfloat16) + lr == torch.tensor(0.02, dtype=torch.bfloat16)

    def update(dtype: str):
        policy = load_policy(tiny_model_dir, dtype=dtype)
        before = [p.detach().clone() for p in policy.model.parameters()]
        trainer = PolicyTrainer(policy, train_config(learning_rate=lr, mini_batch_size=64, logits_chunk_tokens=chunk),
                                algo_config(kl_coef=0.0, entropy_coef=0.0))
        computed = []
        layer = policy.model.model.layers[-1].mlp.down_proj
        hook = layer.register_forward_hook(lambda m, i, o: computed.append(o.dtype))
        assert trainer.update(fixed_batch(policy), seed=0)["optimizer_steps"] == 1
        hook.remove()
        optimizer = {v.dtype for state in trainer.optimizer.state.values() for v in state.values() if v.numel() > 1}
        return policy, computed, optimizer, [(a.detach() - b) for a, b in zip(policy.model.parameters(), before)]

    policy, computed, optimizer, moved = update("bfloat16")
    assert policy.compute_dtype == torch.bfloat16 and set(computed) == {torch.bfloat16}  # bf16 compute
    assert {p.dtype for p in policy.model.parameters()} == optimizer == {torch.float32}  # master weights, AdamW
    total = sum(m.numel() for m in moved)
    assert sum(int((m != 0).sum()) for m in moved) >= 0.9 * total
    _, reference_computed, _, reference = update("float32")
    assert set(reference_computed) == {torch.float32}
    for bf16_step, float32_step in zip(moved, reference):
        assert float((bf16_step - float32_step).abs().max()) <= 2.01 * lr  # a step is at most lr (Adam's first)
    same_sign = sum(int((torch.sign(a) == torch.sign(b))[b.abs() > lr / 2].sum()) for a, b in zip(moved, reference))
    assert same_sign >= 0.95 * sum(int((b.abs() > lr / 2).sum()) for b in reference)


@pytest.mark.parametrize("lora", [None, LoraSection(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"))])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_log_probs_entropy_and_gradients_equal_the_whole_logits(tiny_model_dir, lora, temperature):
    """The output layer on response positions in chunks of 5 (recomputed in the backward pass)
    against every position's logits at once: the same log-probs, entropies and gradients,
    within 1e-5 in float32; shared prefixes included."""
    def run(chunk):
        torch.manual_seed(0)
        policy = load_policy(tiny_model_dir, lora=lora)
        trainer = PolicyTrainer(policy, train_config(logits_chunk_tokens=chunk), algo_config(), temperature=temperature)
        rules = list(range(5, 45)) * 2  # an 80-token shared prefix
        table = fixed_batch(policy)
        batches = micro_batches(table["prompt_token_ids"].to_list(), table["response_token_ids"].to_list(),
                                trainer.pad_id, share_prefix=True)
        batches += micro_batches([rules + [50], rules + [51, 52]], [[60, 61, 62], [63]], trainer.pad_id,
                                 share_prefix=True)
        out = []
        for batch in batches:
            policy.model.zero_grad()
            logprobs, entropy = trainer.forward(batch, entropy=True)
            mask = batch.response_mask.bool()
            (logprobs[mask].sum() + 0.1 * entropy[mask].sum()).backward()
            grads = [p.grad.clone() for p in trainer.parameters]
            out.append((logprobs[mask].detach(), entropy[mask].detach(), grads, batch.shared))
        return out

    chunked, whole = run(5), run(None)
    assert any(shared for *_, shared in whole) and max(lp.numel() for lp, *_ in whole) > 5  # several chunks
    for (lp, en, grads, _), (lp0, en0, grads0, _) in zip(chunked, whole, strict=True):
        assert torch.allclose(lp, lp0, atol=1e-5) and torch.allclose(en, en0, atol=1e-5)
        assert all(torch.allclose(g, g0, atol=1e-5) for g, g0 in zip(grads, grads0))


def test_a_chunked_update_equals_the_whole_logits_update(tiny_model_dir):
    def update(chunk):
        policy = load_policy(tiny_model_dir)
        trainer = PolicyTrainer(policy, train_config(learning_rate=1e-3, mini_batch_size=4, logits_chunk_tokens=chunk),
                                algo_config())
        metrics = [trainer.update(fixed_batch(policy), seed=0) for _ in range(2)]
        return metrics, [p.detach() for p in trainer.parameters]

    (chunked, weights), (whole, weights0) = update(3), update(None)
    for a, b in zip(chunked, whole):
        for key in ("loss", "kl", "entropy", "policy_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert all(torch.allclose(w, w0, atol=1e-5) for w, w0 in zip(weights, weights0))


def test_the_trainer_scores_the_tempered_policy_the_rollouts_sample(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    policy = load_policy(tiny_model_dir)
    table = fixed_batch(policy)
    temperature = 0.5
    scored = PolicyTrainer(policy, train_config(), algo_config(), temperature=temperature).logprobs(table)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for prompt, response, mine in zip(table["prompt_token_ids"], table["response_token_ids"], scored):
        prompt, response = prompt.to_list(), response.to_list()
        with torch.no_grad():
            logits = plain(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
        untempered = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
        assert mine == pytest.approx(expected.tolist(), abs=1e-5)
        assert mine != pytest.approx(untempered.tolist(), abs=1e-3)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            PolicyTrainer(policy, train_config(), algo_config(), temperature=bad)


def test_learning_rate_schedules_by_hand():
    constant = train_config(iterations=4, learning_rate=1e-3)
    assert [constant.learning_rate_at(k) for k in (1, 2, 3, 4)] == [1e-3] * 4
    linear = train_config(iterations=4, learning_rate=1e-3, lr_schedule="linear")
    # lr * (1 - (k - 1) / K): 1, 3/4, 1/2, 1/4 of the rate; clamped outside 1..K
    assert [linear.learning_rate_at(k) for k in (0, 1, 2, 3, 4, 9)] == pytest.approx(
        [1e-3, 1e-3, 7.5e-4, 5e-4, 2.5e-4, 2.5e-4])
    with pytest.raises(ValueError, match="lr_schedule"):
        train_config(lr_schedule="cosine")


def test_update_runs_at_the_learning_rate_it_is_given(tiny_model_dir):
    policy = load_policy(tiny_model_dir)
    trainer = PolicyTrainer(policy, train_config(learning_rate=1e-2, mini_batch_size=64),
                            algo_config(kl_coef=0.0, entropy_coef=0.0))
    before = [p.detach().clone() for p in trainer.parameters]
    metrics = trainer.update(fixed_batch(policy), seed=0, learning_rate=1e-4)
    assert metrics["optimizer_steps"] == 1 and metrics["learning_rate"] == 1e-4
    # AdamW's first step moves every weight with a gradient by lr * g / (|g| + eps) ~ lr (no decay):
    # the step is the given 1e-4, not the configured 1e-2.
    largest = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.parameters, before))
    assert largest == pytest.approx(1e-4, rel=1e-3)


def tiny_run(tiny_model_dir, tmp_path, *extra: str) -> Settings:
    return load_settings([
        f"model.path={tiny_model_dir}", "model.build=null", "train.iterations=3", "train.learning_rate=1e-3",
        "train.lr_schedule=linear",  # a resumed run must also resume the schedule
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=6", f"paths.artifacts={tmp_path}", f"paths.results={tmp_path}/results", *extra,
    ])


def weights(settings: Settings) -> dict[str, torch.Tensor]:
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    from safetensors.torch import load_file

    name = "adapter_model.safetensors" if latest.kind == "lora" else "model.safetensors"
    return load_file(latest.path / name)


@pytest.fixture
def deterministic_torch():
    """train.deterministic changes process-wide state (environment variables, torch flags):
    put it back after the test."""
    import os

    environment = dict(os.environ)
    enabled, cudnn = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    yield
    os.environ.clear()
    os.environ.update(environment)
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = cudnn


@pytest.mark.e2e
@pytest.mark.parametrize("lora", [False, True])
def test_interrupt_and_resume_gives_the_same_weights(tiny_model_dir, tmp_path, monkeypatch, deterministic_torch, lora):
    # deterministic kernels: on a GPU, atomic-add reductions would otherwise differ run to run
    extra = ["train.deterministic=true"]
    extra += ["+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}"] if lora else []
    uninterrupted = tiny_run(tiny_model_dir, tmp_path / "a", *extra)
    train(uninterrupted, progress=False)

    interrupted = tiny_run(tiny_model_dir, tmp_path / "b", *extra)
    real_writer = ckpt.checkpoint_writer

    def crash_on_second(root, iteration, *args, **kwargs):
        if iteration == 2:  # after iteration 2's update, before its checkpoint
            raise KeyboardInterrupt("simulated crash")
        return real_writer(root, iteration, *args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint_writer", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, progress=False)
    monkeypatch.setattr(ckpt, "checkpoint_writer", real_writer)
    paths = RunLayout.of(interrupted)
    assert [c.iteration for c in ckpt.list_checkpoints(paths.checkpoints)] == [1]
    assert not [p for p in paths.checkpoints.iterdir() if p.name.startswith(".")]  # no half-written directory
    # resumed from a copy in another folder (a run copied to another folder: docs/pipeline.md, "Failures
    # and resuming"), which leaves the original as it was, and then where it stopped: the loop reads the
    # checkpoints on disk, whatever folder they are in
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    copied = tiny_run(tiny_model_dir, tmp_path / "c", *extra)
    for resumed_run in (copied, interrupted):
        resumed = train(resumed_run, progress=False)
        assert resumed.iterations == [2, 3]
        if resumed_run is copied:
            assert [c.iteration for c in ckpt.list_checkpoints(paths.checkpoints)] == [1]
        a, b = weights(uninterrupted), weights(resumed_run)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        table_a = pl.read_parquet(RunLayout.of(uninterrupted).rollout(3))
        table_b = pl.read_parquet(RunLayout.of(resumed_run).rollout(3))
        assert table_a.drop("run_id").equals(table_b.drop("run_id"))
        manifest = ckpt.latest_checkpoint(RunLayout.of(resumed_run).checkpoints).manifest
        assert manifest["iteration"] == 3 and manifest["parent"].endswith("ckpt-00002")
        assert manifest["kind"] == ("lora" if lora else "full") and "train/loss" in manifest["metrics"]
        # linear schedule: iteration 3 of 3 ran at 1e-3 * (1 - 2/3), resumed or not
        assert manifest["metrics"]["train/learning_rate"] == pytest.approx(1e-3 / 3)


@pytest.mark.e2e
def test_a_corrupted_checkpoint_is_skipped(tiny_model_dir, tmp_path):
    settings = tiny_run(tiny_model_dir, tmp_path, "train.iterations=2")
    train(settings, progress=False)
    root = RunLayout.of(settings).checkpoints
    newest = ckpt.latest_checkpoint(root)
    (newest.path / "model.safetensors").write_bytes(b"truncated")
    assert ckpt.latest_checkpoint(root).iteration == 1


def test_shared_prefix_forward_is_exact_with_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from mage.trainer.batching import causal_lm_forward

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rules = list(range(5, 45)) * 2  # an 80-token common prefix
    prompts = [rules + [50, 51], rules + [52], rules + [53, 54, 55, 56]]
    responses = [[60, 61], [62, 63, 64], [65]]

    def logprobs_and_grad(share: bool):
        batch = micro_batches(prompts, responses, 0, "bucketed", share_prefix=share)[0]
        assert (batch.shared > 0) == share
        model.zero_grad()
        logits = causal_lm_forward(model, batch, torch.device("cpu"))[:, :-1]
        logp = torch.log_softmax(logits, -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) * batch.response_mask
        logp.sum().backward()
        grad = model.model.embed_tokens.weight.grad.clone()
        order = sorted(range(len(batch.rows)), key=lambda r: batch.rows[r])
        return logp[order].detach(), grad

    plain, plain_grad = logprobs_and_grad(False)
    shared, shared_grad = logprobs_and_grad(True)
    assert torch.allclose(plain, shared, atol=1e-5)
    assert torch.allclose(plain_grad, shared_grad, atol=1e-5)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("lora", [None, LoraSection(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj", "up_proj"))])
def test_gradient_checkpointing_keeps_less_for_backward_and_gives_the_same_update(tiny_model_dir, lora, chunk):
    def updated(checkpointing: bool):
        torch.manual_seed(0)  # the same random LoRA A matrices in both runs
        policy = load_policy(tiny_model_dir, lora=lora)
        cfg = train_config(learning_rate=1e-2, mini_batch_size=2, gradient_checkpointing=checkpointing,
                           logits_chunk_tokens=chunk)
        trainer = PolicyTrainer(policy, cfg, algo_config())
        saved = []  # every tensor autograd keeps for the backward pass, by size

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            metrics = trainer.update(fixed_batch(policy), seed=0)
        # generation after the update must keep its KV cache: no layer is left in training mode
        assert not any(m.training for m in policy.model.modules())
        weights = [p.detach().clone() for p in trainer.parameters]
        return metrics, weights, sum(saved)

    plain, plain_weights, plain_saved = updated(False)
    checkpointed, checkpointed_weights, checkpointed_saved = updated(True)
    assert plain["optimizer_steps"] == checkpointed["optimizer_steps"] == 2
    # Checkpointing keeps only each layer's input for the backward pass, not its activations.
    assert checkpointed_saved < 0.6 * plain_saved
    assert checkpointed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    for a, b in zip(plain_weights, checkpointed_weights):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_fresh_lora_adapter_depends_on_the_seed_alone(tiny_model_dir, tmp_path):
    def adapter(seed: int, noise: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(noise)  # whatever the process drew before
        settings = tiny_run(tiny_model_dir, tmp_path, f"seed={seed}", "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}")
        state = start_training(settings)
        return {k: v.detach().clone() for k, v in state.policy.model.named_parameters() if v.requires_grad}

    first, again, other = adapter(0, noise=1), adapter(0, noise=2), adapter(1, noise=1)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_drift_is_a_rise_over_the_first_iteration_or_a_large_kl():
    cfg = train_config(drift_invalid_rise=0.15, drift_kl=1.0)
    first = {"iteration": 1, "rollout/invalid_rate": 0.40, "train/kl": 0.0}  # a warm start that begins invalid
    assert drift_warning(cfg, {"iteration": 5, "rollout/invalid_rate": 0.50, "train/kl": 0.9}, first) is None
    rose = drift_warning(cfg, {"iteration": 6, "rollout/invalid_rate": 0.60, "train/kl": 0.2}, first)
    assert rose.startswith("iteration 6: invalid rate 0.60 (first iteration 0.40), KL 0.20")
    assert "KL 1.20" in drift_warning(cfg, {"iteration": 7, "rollout/invalid_rate": 0.40, "train/kl": 1.2}, first)
    assert drift_warning(train_config(drift_kl=2.0), {"iteration": 7, "train/kl": 1.2}, {}) is None  # the key is read
