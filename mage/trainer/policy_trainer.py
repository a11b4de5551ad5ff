"""The policy update: token-level PPO on a trajectory table with advantages.

``PolicyTrainer.update(table)`` reads the table's token ids and advantages and:

1. recomputes the old log-probs with the current policy (no gradient) and the reference
   log-probs (LoRA: the same model with the adapter disabled; full fine-tuning: the same
   model with the starting weights put back for that pass, from a copy in host memory, so
   the accelerator never holds a second model), both over length-bucketed micro-batches;
2. for each PPO epoch, shuffles the calls, cuts them into mini-batches of
   ``mini_batch_size`` calls and, per mini-batch, accumulates the gradients of its
   micro-batches (token-mean over the mini-batch, see ``mage.algo.losses``), clips the
   gradient norm and takes one AdamW step.

The policy is the one the rollouts sampled from: with ``temperature`` τ (the training
rollouts' ``engine.sampling.temperature``) every log-prob, the ratio's, the reference's, the
KL's and the entropy's, is of ``softmax(logits / τ)``, as in TRL's GRPO trainer. At τ = 1,
the default, that is the model's own distribution. Top-p and top-k are not modelled: with
them the rollouts sample from a truncated distribution and PPO runs slightly off-policy.

Calls without response tokens (a backend that returned nothing) carry no loss and are
skipped. The model stays in eval mode: no dropout, so at the first step ratio = 1 exactly.
With ``train.gradient_checkpointing`` only the decoder layers' own ``training`` flags are
raised, and only during the PPO pass: transformers checkpoints a layer when that flag is
set, dropout modules below it stay in eval mode, and generation between updates keeps its
KV cache.

With ``torch.distributed`` initialised (``train.workers`` > 1: Ray Train's workers), every
rank runs this same update on its share of each mini-batch, the model sharded with FSDP2 or
replicated with DDP (``train.sharding``); :mod:`mage.trainer.distributed` says how the ranks'
gradients add up to the single-process one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext

import numpy as np
import polars as pl
import torch

from mage.algo.losses import POLICY_LOSSES, BehaviourWeights, entropy_from_logits, token_logprobs
from mage.config.sections import AlgoSection, TrainSection
from mage.models.policy import Policy
from mage.trainer.batching import MicroBatch, causal_lm_forward, micro_batches, output_layer
from mage.trainer.distributed import Collective, full_value, local, wrap
from mage.trainer.logprobs import response_logprobs


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ResponseScorer(torch.nn.Module):
    """The trainer's forward pass as one module: log-probs [B, K] of a micro-batch's
    right-aligned response tokens (and their entropies) at ``temperature``; with
    ``chunk_tokens``, through the output layer in chunks of response positions
    (:mod:`mage.trainer.logprobs`), 0 at padding. One module so that FSDP2's root gathers the
    output layer's weights around the whole pass (``mage.trainer.distributed.wrap``)."""

    def __init__(self, policy: Policy, head: torch.nn.Module, temperature: float, chunk_tokens: int | None) -> None:
        super().__init__()
        self.model, self.head = policy.model, head
        self.policy, self.temperature, self.chunk_tokens = policy, temperature, chunk_tokens

    def forward(self, batch: MicroBatch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.policy.device
        targets = batch.targets.to(device)
        if self.chunk_tokens is not None:
            with self.policy.autocast():  # model.dtype's compute, float32 master weights (mage.models.policy.Policy)
                hidden = causal_lm_forward(self.model, batch, device, hidden=True)[:, :-1]
            logprobs, entropies = response_logprobs(hidden, self.head, targets, batch.response_mask.to(device),
                                                    self.temperature, self.chunk_tokens, entropy,
                                                    self.policy.compute_dtype)
        else:
            with self.policy.autocast():
                logits = causal_lm_forward(self.model, batch, device)[:, :-1]  # position p predicts p + 1
            if self.temperature != 1.0:
                logits = logits.float() / self.temperature  # in float32, as the samplers apply it
            logprobs, entropies = token_logprobs(logits, targets), entropy_from_logits(logits) if entropy else None
        # [B, K] each: copies, not views, so FSDP2's hook before the backward pass stays on them
        return logprobs.clone(), entropies.clone() if entropies is not None else None


def stale_rows(table: pl.DataFrame, policy_version: int | None,
               lengths: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Which rows of ``table`` were sampled from weights older than ``policy_version`` ([rows]
    bool), and every row's behaviour log-probs for the loss (a stale row's recorded
    ``response_logprobs``, zeros for a fresh one), or None when no row is stale. A stale row
    without a log-prob for each of its reply tokens is an error: it cannot be weighed."""
    stale = torch.zeros(len(lengths), dtype=torch.bool)
    if policy_version is None or "policy_version" not in table.columns:
        return stale, None
    # a row of unknown version (a table from before the column) is taken as fresh
    stale = torch.from_numpy((table["policy_version"].fill_null(policy_version) < policy_version).to_numpy().copy())
    if not bool(stale.any()):
        return stale, None
    recorded = table["response_logprobs"].to_list() if "response_logprobs" in table.columns else [None] * len(lengths)
    behaviour = []
    for row, (is_stale, logprobs, length) in enumerate(zip(stale.tolist(), recorded, lengths, strict=True)):
        if not is_stale:
            behaviour.append(torch.zeros(length))
        elif logprobs is None or len(logprobs) != length:
            raise ValueError(f"row {row} was sampled from an older policy (policy_version < {policy_version}) but "
                             f"records {0 if logprobs is None else len(logprobs)} log-probs for its {length} reply "
                             "tokens: the update cannot weigh it by the behaviour policy")
        else:
            behaviour.append(torch.tensor(logprobs, dtype=torch.float32))
    return stale, behaviour


def added(left: BehaviourWeights, right: BehaviourWeights) -> BehaviourWeights:
    """Two micro-batches' behaviour-weight sums as one."""
    return BehaviourWeights(total=left.total + right.total, squares=left.squares + right.squares,
                            largest=max(left.largest, right.largest), truncated=left.truncated + right.truncated,
                            stale=left.stale + right.stale, tokens=left.tokens + right.tokens)


class PolicyTrainer:
    """Owns the policy, its reference and the optimizer; see the module docstring."""

    def __init__(self, policy: Policy, train: TrainSection, algo: AlgoSection, temperature: float = 1.0,
                 collective: Collective | None = None) -> None:
        if not temperature > 0:  # also rejects NaN
            raise ValueError(f"temperature: the sampling temperature of the trained policy must be > 0, "
                             f"got {temperature}")
        self.policy, self.train_cfg, self.algo = policy, train, algo
        self.temperature = float(temperature)
        self.model = policy.model
        self.device = policy.device
        self.pad_id = policy.tokenizer.pad_token_id
        self.head = output_layer(self.model)
        if train.logits_chunk_tokens is not None and type(self.head) is not torch.nn.Linear:
            raise ValueError(f"train.logits_chunk_tokens: the chunked log-probs need a plain linear output layer, "
                             f"this model's is a {type(self.head).__name__} (LoRA on lm_head?); set it to null")
        from transformers.modeling_layers import GradientCheckpointingLayer

        self.collective = collective or Collective(device=self.device)
        layers = [m for m in self.model.modules() if isinstance(m, GradientCheckpointingLayer)]
        self.scorer = wrap(ResponseScorer(policy, self.head, self.temperature, train.logits_chunk_tokens), layers,
                           train.sharding, self.collective)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        # Full fine-tuning's reference is the starting weights: a copy in host memory, put into
        # the model for the reference pass (once an update), never a second model on the device
        # (with FSDP2, each rank's shard of them).
        self.reference: list[torch.Tensor] | None = None
        if not policy.is_lora and algo.kl_coef:
            self.reference = [local(p).detach().to("cpu", copy=True) for p in self.parameters]
        if not self.parameters:
            raise ValueError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=train.learning_rate,
            betas=train.betas,
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )
        self.model.eval()
        self.checkpointed_layers: list[torch.nn.Module] = []
        if train.gradient_checkpointing:
            # non-reentrant checkpointing: LoRA inputs need no requires_grad hook. Torch's random
            # state is not saved and put back around each recompute: the model runs in eval mode
            # (no dropout draws from it), and a rollout behind the update (train.max_staleness)
            # samples from it on another thread meanwhile, which putting it back would disturb
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                                    "preserve_rng_state": False})
            self.checkpointed_layers = [m for m in self.model.modules() if isinstance(m, GradientCheckpointingLayer)]
            if not self.checkpointed_layers:
                raise ValueError(f"train.gradient_checkpointing: {type(self.model).__name__} has no checkpointable layers")

    @contextmanager
    def _checkpointing(self):
        """Gradient checkpointing on for the PPO pass (see the module docstring)."""
        for layer in self.checkpointed_layers:
            layer.training = True  # this module's flag alone: its dropout children stay in eval mode
        try:
            yield
        finally:
            for layer in self.checkpointed_layers:
                layer.training = False

    # -- forward passes ----------------------------------------------------------------
    @contextmanager
    def _reference_context(self):
        """Inside, the model is the reference policy: LoRA's adapter disabled, or full
        fine-tuning's starting weights in place of the current ones (put back after)."""
        if self.policy.is_lora:
            with self.model.disable_adapter():
                yield
            return
        current = [local(p).detach().to("cpu", copy=True) for p in self.parameters]
        try:
            with torch.no_grad():
                for parameter, weights in zip(self.parameters, self.reference):
                    local(parameter).copy_(weights)
            yield
        finally:
            with torch.no_grad():
                for parameter, weights in zip(self.parameters, current):
                    local(parameter).copy_(weights)

    def forward(self, batch: MicroBatch, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [B, K] of the right-aligned response tokens (and their entropies): :class:`ResponseScorer`."""
        return self.scorer(batch, entropy)

    @torch.no_grad()
    def _score(self, prompts, responses, rows: list[int], lengths: Sequence[int],
               references: Sequence[bool]) -> list[list[torch.Tensor | None]]:
        """Per-row log-probs of the response tokens of ``rows``, for each of ``references``
        (False: the current policy, True: the reference). Each rank scores its share of the
        rows and every rank gets every row's."""
        mine = self.collective.share(rows, lengths)
        batches = self._batches(prompts, responses, mine, batching="bucketed") if mine else []
        fillers = self.collective.most(len(batches)) - len(batches)  # passes every rank runs
        filler = self._batches(prompts, responses, rows[:1], batching="bucketed")[:1] if fillers else []
        out = []
        for reference in references:
            with self._reference_context() if reference else nullcontext():
                scored = self._score_rows(batches, lengths)
                self._score_rows(filler * fillers, lengths)  # run, not kept
            merged = self.collective.gather({row: scored[row] for row in mine})
            out.append([merged.get(i) for i in range(len(lengths))])
        return out

    def _score_rows(self, batches: Sequence[MicroBatch], lengths: Sequence[int]) -> dict[int, torch.Tensor]:
        per_row = {}
        for batch in batches:
            logprobs, _ = self.forward(batch)
            for r, row in enumerate(batch.rows):
                per_row[row] = logprobs[r, logprobs.shape[1] - lengths[row] :].float().cpu()
        return per_row

    def _aligned(self, values: Sequence[torch.Tensor], batch: MicroBatch) -> torch.Tensor:
        width = batch.targets.shape[1]
        out = torch.zeros((len(batch.rows), width))
        for r, row in enumerate(batch.rows):
            if len(values[row]):
                out[r, width - len(values[row]) :] = values[row]
        return out.to(self.device)

    def _batches(self, prompts, responses, rows: list[int] | None = None, batching: str | None = None,
                 share_prefix: bool | None = None) -> list[MicroBatch]:
        cfg = self.train_cfg
        index = list(range(len(prompts))) if rows is None else rows
        batches = micro_batches(
            [prompts[i] for i in index],
            [responses[i] for i in index],
            self.pad_id,
            batching or cfg.batching,
            cfg.micro_batch_tokens,
            cfg.micro_batch_rows,
            cfg.share_prefix if share_prefix is None else share_prefix,
        )
        for batch in batches:  # back to indices of the full table
            batch.rows = [index[r] for r in batch.rows]
        return batches

    def logprobs(self, table: pl.DataFrame) -> list[list[float]]:
        """The policy's teacher-forced log-probs of every row's response tokens (what the PPO
        ratio's denominator is), as lists; rows without response tokens give []."""
        prompts = table["prompt_token_ids"].to_list()
        responses = table["response_token_ids"].to_list()
        lengths = [len(r) for r in responses]
        rows = [i for i, n in enumerate(lengths) if n]
        out: list[list[float]] = [[] for _ in lengths]
        if rows:
            (scored,) = self._score(prompts, responses, rows, lengths, references=(False,))
            for i in rows:
                out[i] = scored[i].tolist()
        return out

    def _weight_metrics(self, weights: BehaviourWeights) -> dict[str, float]:
        """The behaviour weights of an update's stale reply tokens, every rank's and epoch's:
        their mean, standard deviation and largest before the cap, and the share the cap cut
        (1, 0, 1 and 0 when none is stale: a fresh token's weight is 1); and the share of reply
        tokens that are stale."""
        summed = self.collective.total({"total": weights.total, "squares": weights.squares, "truncated": weights.truncated,
                                        "stale": weights.stale, "tokens": weights.tokens})
        largest = self.collective.largest(weights.largest)
        stale = summed["stale"]
        if not stale:
            mean, deviation, largest, truncated = 1.0, 0.0, 1.0, 0.0
        else:
            mean = summed["total"] / stale
            deviation = max(summed["squares"] / stale - mean * mean, 0.0) ** 0.5
            truncated = summed["truncated"] / stale
        return {"behaviour_weight_mean": mean, "behaviour_weight_std": deviation, "behaviour_weight_max": largest,
                "behaviour_weight_truncated_share": truncated,
                "stale_token_share": stale / max(summed["tokens"], 1.0)}

    # -- the update ----------------------------------------------------------------------
    def update(self, table: pl.DataFrame, seed: int = 0, learning_rate: float | None = None,
               policy_version: int | None = None) -> dict[str, float]:
        """One PPO update on ``table`` (it must have an ``advantage`` column).

        ``learning_rate`` (default: ``train.learning_rate``) is the rate of every optimizer
        step of this update: the caller's schedule decides it per iteration. ``policy_version``
        is the version of the weights the update starts from: a row sampled from an older one
        (its ``policy_version`` column) is stale, and ``algo.policy_loss`` weighs it by its
        recorded ``response_logprobs`` (None: every row is fresh).
        """
        if "advantage" not in table.columns:
            raise ValueError("the table has no 'advantage' column: run add_returns and add_advantages first")
        table = table.filter(pl.col("response_token_ids").list.len() > 0)
        if table.is_empty():
            raise ValueError("no call with response tokens to train on")
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        prompts = table["prompt_token_ids"].to_list()
        responses = table["response_token_ids"].to_list()
        advantages = torch.tensor(table["advantage"].to_numpy(), dtype=torch.float32)
        lengths = [len(r) for r in responses]
        scored = self._score(prompts, responses, list(range(len(prompts))), lengths,
                             references=(False, True) if self.algo.kl_coef else (False,))
        old, ref = scored[0], (scored[1] if self.algo.kl_coef else None)
        stale, behaviour = stale_rows(table, policy_version, lengths)
        loss_of = POLICY_LOSSES[self.algo.policy_loss]
        weights = BehaviourWeights()
        world = self.collective.world

        cfg = self.train_cfg
        learning_rate = cfg.learning_rate if learning_rate is None else float(learning_rate)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        rng = np.random.default_rng(seed)
        totals = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        steps = trained_tokens = padded_tokens = 0
        # a checkpointed layer drops the prefix's KV cache, and an FSDP2 layer frees its gathered
        # weights between the prefix's pass and the rest's, which the backward pass of the prefix
        # still needs: either way the PPO pass runs whole sequences
        fsdp = world > 1 and cfg.sharding == "fsdp"
        share_prefix = cfg.share_prefix and not self.checkpointed_layers and not fsdp
        with self._checkpointing():
            for _ in range(cfg.ppo_epochs):
                order = rng.permutation(len(prompts)).tolist()
                for start in range(0, len(order), cfg.mini_batch_size):
                    rows = order[start : start + cfg.mini_batch_size]
                    mini_tokens = sum(lengths[i] for i in rows)
                    self.optimizer.zero_grad(set_to_none=True)
                    weighted = {k: 0.0 for k in ("loss", "policy_loss", "kl", "entropy", "clip_fraction")}
                    mine = self.collective.share(rows, lengths)
                    batches = self._batches(prompts, responses, mine, share_prefix=share_prefix) if mine else []
                    real = len(batches)
                    passes = self.collective.most(real)  # every rank runs as many (mage.trainer.distributed)
                    if passes > real:
                        filler = self._batches(prompts, responses, rows[:1], share_prefix=share_prefix)[:1]
                        batches += filler * (passes - real)
                    for index, batch in enumerate(batches):
                        counted = index < real  # a filler pass adds nothing: its loss is multiplied by 0
                        logprobs, entropy = self.forward(batch, entropy=bool(self.algo.entropy_coef))
                        parts = loss_of(
                            logprobs,
                            self._aligned(old, batch),
                            self._aligned(ref, batch) if ref is not None else None,
                            advantages[batch.rows].to(self.device),
                            batch.response_mask.to(self.device),
                            self.algo,
                            mini_tokens,
                            entropy,
                            behaviour_logprobs=self._aligned(behaviour, batch) if behaviour is not None else None,
                            stale=stale[batch.rows].to(self.device),
                        )
                        # FSDP2 and DDP average the ranks' gradients: times the ranks, they add up
                        (parts.loss * (world if counted else 0.0)).backward()
                        if not counted:
                            continue
                        share = parts.tokens / max(mini_tokens, 1)
                        weighted["loss"] += parts.loss.item()
                        for key, value in (("policy_loss", parts.policy), ("kl", parts.kl), ("entropy", parts.entropy),
                                           ("clip_fraction", parts.clip_fraction)):
                            weighted[key] += share * value
                        padded_tokens += batch.padded_tokens
                        trained_tokens += batch.real_tokens
                        if parts.weights is not None:
                            weights = added(weights, parts.weights)
                    grad_norm = full_value(torch.nn.utils.clip_grad_norm_(self.parameters, cfg.grad_clip))
                    self.optimizer.step()
                    steps += 1
                    for key, value in self.collective.total(weighted).items():
                        totals[key] += value
                    totals["grad_norm"] += grad_norm
        seconds = time.perf_counter() - started
        peak = _peak_memory_mib(self.device)
        counted = self.collective.total({"trained": trained_tokens, "padded": padded_tokens})
        trained_tokens, padded_tokens = int(counted["trained"]), int(counted["padded"])
        metrics = {key: value / max(steps, 1) for key, value in totals.items()}
        if self.train_cfg.max_staleness:
            metrics.update(self._weight_metrics(weights))
        # Off-policy drift: the rollout's log-probs against the trainer's for the same tokens.
        # Near 0 when the generating engine serves the policy being trained (numerical noise).
        # Backends record the model's own log-probs (temperature 1), so only then do they compare.
        comparable = "response_logprobs" in table.columns and self.temperature == 1.0
        recorded = table["response_logprobs"].to_list() if comparable else []
        # (fresh rows only: a stale row's gap is the update between, which the behaviour weights show)
        gaps = [abs(a - b) for row, mine, is_stale in zip(recorded, old, stale.tolist())
                if row and mine is not None and len(row) == len(mine) and not is_stale
                for a, b in zip(row, mine.tolist())]
        if gaps:
            metrics.update(rollout_logprob_gap_mean=float(np.mean(gaps)), rollout_logprob_gap_max=float(np.max(gaps)))
        metrics.update(
            optimizer_steps=steps,
            learning_rate=learning_rate,
            calls=len(prompts),
            response_tokens=sum(lengths),
            tokens=trained_tokens,
            padding_share=1 - trained_tokens / max(padded_tokens, 1),
            seconds=seconds,
            tokens_per_second=trained_tokens / seconds if seconds else 0.0,
            advantage_mean=float(advantages.mean()),
            advantage_abs_mean=float(advantages.abs().mean()),
            peak_memory_mib=peak if world == 1 else float(self.collective.most(int(peak))),  # the largest rank's
        )
        return metrics
