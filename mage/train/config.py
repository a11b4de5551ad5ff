"""Settings of the trainer (``params/train``) and of LoRA (``params/model``'s ``lora``)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field
from pydantic.dataclasses import dataclass as validated_dataclass

from mage.train.batching import Batching

LrSchedule = Literal["constant", "linear"]
LR_SCHEDULES = get_args(LrSchedule)

PositiveInt = Annotated[int, Field(ge=1)]
AdamBeta = Annotated[float, Field(ge=0, lt=1)]


@validated_dataclass(frozen=True)
class LoraSettings:
    """peft LoRA; the reference policy is the base model with the adapter disabled."""

    r: Annotated[int, Field(ge=1, le=1024)] = 16
    alpha: Annotated[float, Field(gt=0)] = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@validated_dataclass(frozen=True)
class TrainConfig:
    """The policy update and the training loop (MAGE-SPEC section 5). Ranges are checked on
    construction: torch takes a negative gradient clip or learning rate without complaint."""

    iterations: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    learning_rate: Annotated[float, Field(gt=0, le=1)] = 1e-5
    lr_schedule: LrSchedule = "constant"  # linear: CleanRL's PPO annealing, lr/iterations at the last iteration
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.999)
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-8
    grad_clip: Annotated[float, Field(gt=0)] = 1.0
    ppo_epochs: Annotated[int, Field(ge=1, le=100)] = 1
    mini_batch_size: PositiveInt = 64  # rows (LLM calls) per optimizer step (paper: 64)
    batching: Batching = "bucketed"
    micro_batch_tokens: PositiveInt = 16384  # bucketed: padded tokens per micro-batch
    micro_batch_rows: PositiveInt = 8  # padded: rows per micro-batch
    share_prefix: bool = True  # run a micro-batch's common prompt prefix once
    # Recompute each decoder layer's activations in the backward pass instead of keeping
    # them: about a third more compute for one layer's activations instead of all of them
    # (a 4B model's PPO step on 16k-token micro-batches needs it on an 80 GB GPU:
    # BENCHMARKS.md). The PPO pass then runs without the shared prefix (its KV cache
    # cannot be recomputed); the scoring passes keep it.
    gradient_checkpointing: bool = False
    # transformers' enable_full_determinism: deterministic CUDA kernels, so a GPU run (and a
    # resumed one) repeats bitwise; slower. CPU runs repeat without it.
    deterministic: bool = False
    seed: Annotated[int, Field(ge=0)] = 0
    checkpoint_every: PositiveInt = 1  # iterations; 1 loses no finished iteration on a crash
    keep_checkpoints: PositiveInt | None = None  # newest kept (None: all)
    eval_every: Annotated[int, Field(ge=0)] = 0  # iterations between evaluations in the flow (0: only at the end)
    # Drift warnings: the invalid-reply rate rising this far over the run's first iteration
    # (a warm start may begin with many invalid replies: the Tic-Tac-Toe one does), or a KL
    # to the reference above drift_kl. They change no result.
    drift_invalid_rise: Annotated[float, Field(gt=0, le=1)] = 0.15
    drift_kl: Annotated[float, Field(gt=0)] = 1.0

    def learning_rate_at(self, iteration: int) -> float:
        """The learning rate of (1-based) ``iteration``.

        ``linear``: lr_k = lr * (1 - (k - 1) / K) for iteration k of K, so the first
        iteration runs at the full rate and the last at lr / K. Late updates are small, so a
        policy that has found a good strategy keeps it instead of drifting away from it.
        """
        if self.lr_schedule == "constant" or self.iterations <= 0:
            return self.learning_rate
        fraction = 1.0 - (min(max(iteration, 1), self.iterations) - 1) / self.iterations
        return self.learning_rate * fraction
