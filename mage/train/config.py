"""Settings of the trainer (``params/train``) and of LoRA (``params/model``'s ``lora``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mage.train.batching import BATCHINGS

LR_SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class LoraSettings:
    """peft LoRA; the reference policy is the base model with the adapter disabled."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"model.lora.r must be >= 1, got {self.r}")
        if not isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))


@dataclass(frozen=True)
class TrainConfig:
    """The policy update and the training loop (MAGE-SPEC section 5)."""

    iterations: int = 100
    learning_rate: float = 1e-5
    lr_schedule: str = "constant"  # constant | linear (CleanRL's PPO annealing: lr/iterations at the last iteration)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 64  # rows (LLM calls) per optimizer step (paper: 64)
    batching: str = "bucketed"  # bucketed | padded
    micro_batch_tokens: int = 16384  # bucketed: padded tokens per micro-batch
    micro_batch_rows: int = 8  # padded: rows per micro-batch
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
    seed: int = 0
    checkpoint_every: int = 1  # iterations; 1 loses no finished iteration on a crash
    keep_checkpoints: int | None = None  # newest kept (None: all)
    eval_every: int = 0  # iterations between evaluations in the flow (0: only at the end)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batching not in BATCHINGS:
            raise ValueError(f"train.batching must be one of {BATCHINGS}, got {self.batching!r}")
        if self.iterations < 0 or self.ppo_epochs < 1 or self.mini_batch_size < 1:
            raise ValueError("train.iterations >= 0, train.ppo_epochs >= 1 and train.mini_batch_size >= 1 required")
        if self.learning_rate <= 0:
            raise ValueError(f"train.learning_rate must be > 0, got {self.learning_rate}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"train.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        object.__setattr__(self, "betas", tuple(self.betas))

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
