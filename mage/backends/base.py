"""The generation-backend interface shared by ``hf``, ``vllm`` and ``scripted``.

A backend takes a batch of :class:`GenerationRequest` (the user-message text of a prompt,
plus the game-side context that only the scripted backend reads) and
:class:`SamplingSettings`, and returns one :class:`Generation` per request: the text, the
prompt's token ids as the model saw them (chat template applied), the response's token
ids and the log-probability of every sampled token.

Log-probs are the policy's own: ``log_softmax`` of the model's raw logits at temperature
1, before temperature, top-k or top-p reshape the sampling distribution. They are what a
teacher-forced forward pass of the same model gives, and what PPO's ratio compares (the
trainer still recomputes them; the rollout's copy is for checks and diagnostics).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

STOP_STRINGS = ("</action>", "</remark>")


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling settings; ``top_k = 0`` and ``top_p = 1.0`` switch those filters off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = STOP_STRINGS
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop", tuple(self.stop))


@dataclass
class GenerationRequest:
    """One LLM call: the prompt text and, for the scripted backend only, its context."""

    prompt: str
    phase: str = "play"  # "play" or "reflect"
    context: Any = None  # the live Episode; real backends never look at it


@dataclass
class Generation:
    """A backend's answer to one request."""

    text: str
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (stop string or end of sequence) or "length"


class Backend(ABC):
    """A text generator; see the module docstring for the contract."""

    name: str = ""
    #: Longest prompt plus response the model accepts, in tokens.
    max_context_tokens: int = 1 << 30

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> list[Generation]:
        """Answer every request; the result is in request order."""

    @abstractmethod
    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        """Tokens each prompt takes once formatted for the model (chat template included)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources (GPU memory, worker processes)."""
