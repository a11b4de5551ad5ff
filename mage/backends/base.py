"""The generation-backend interface shared by ``hf``, ``vllm`` and ``scripted``.

A backend takes a batch of :class:`GenerationRequest` (the user-message text of a prompt,
plus the game-side context that only the scripted backend reads) and
:class:`SamplingSettings`, and returns one :class:`Generation` per request: the text, the
prompt's token ids as the model saw them (chat template applied), the response's token
ids and the log-probability of every sampled token.

Log-probs are the model's own: ``log_softmax`` of its raw logits at temperature 1, before
temperature, top-k or top-p reshape the sampling distribution. They are what a
teacher-forced forward pass of the same model gives, and at sampling temperature 1 what PPO's
ratio compares (the trainer recomputes its own, of ``softmax(logits / temperature)``; the
rollout's copy is for checks and diagnostics).

Stop strings follow the phase (:data:`mage.protocol.PHASE_STOP_STRINGS`, :meth:`SamplingSettings.stop_for`): a play reply ends at ``</action>``, a
reflection at ``</remark>``, so a reflection that quotes ``<action>bet</action>`` in its plan
is not cut there. A stop string inside an open ``<think>`` block (Qwen3 thinking may quote
tags while deliberating) does not end the reply; every backend applies both rules.

Seeds: a request may carry its own ``seed`` (the engine derives one per meta-episode and
call), so the members of a group sample independently even when they share a prompt, and a
run repeats given its seed. ``SamplingSettings.seed`` seeds a whole batch where a backend
cannot seed requests one by one (``hf``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mage.protocol import PHASE_STOP_STRINGS, STOP_STRINGS, THINK_CLOSE, THINK_OPEN
from mage.sections import SamplingSettings

__all__ = ["PHASE_STOP_STRINGS", "STOP_STRINGS", "THINK_CLOSE", "THINK_OPEN", "Backend", "Generation",
           "GenerationRequest", "SamplingSettings", "prompt_opens_thinking", "thinking_open"]


def prompt_opens_thinking(tokenizer: Any, prompt_ids: Sequence[int]) -> bool:
    """Whether a formatted prompt leaves a ``<think>`` block open for the reply (some chat
    templates end with ``<think>``; Qwen3's with thinking off closes an empty block)."""
    return thinking_open(tokenizer.decode(list(prompt_ids[-8:])))


def thinking_open(text: str, open_at_start: bool = False) -> bool:
    """Whether ``text`` ends inside a ``<think>`` block (ASCII case-insensitive, as the parser);
    ``open_at_start``: the block was opened before ``text`` began (by the prompt)."""
    lower = text.lower()
    opened, closed = lower.rfind(THINK_OPEN), lower.rfind(THINK_CLOSE)
    if opened < 0 and closed < 0:
        return open_at_start
    return opened > closed


@dataclass
class GenerationRequest:
    """One LLM call: the prompt text and, for the scripted backend only, its context."""

    prompt: str
    phase: str = "play"  # "play" or "reflect"
    context: Any = None  # the live Episode; real backends never look at it
    seed: int | None = None  # this request's sampling seed (None: the batch's)


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

    def joins(self, others: Sequence[Backend]) -> bool:
        """Whether :meth:`generate_joint` answers the requests of ``others`` (with this
        backend's) in one batch: ``vllm``'s views of one engine on the same base weights."""
        return False

    def generate_joint(self, batches: Sequence[tuple[Backend, Sequence[GenerationRequest]]],
                       sampling: SamplingSettings) -> list[list[Generation]]:
        """Several backends' requests in one batch of this backend's, each answered under its
        own backend's policy (where :meth:`joins` says so); per batch, in request order."""
        raise NotImplementedError(f"{type(self).__name__} answers no other backend's requests")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the backend's resources (GPU memory, worker processes)."""

    def release(self) -> None:
        """Done with this backend for now. By default it is closed; a backend whose engine is
        kept for the whole process (``vllm``: a second engine in one process fails its start)
        leaves the engine running for the next user (evaluation after training)."""
        self.close()

    def load_checkpoint(self, path: Any, kind: str) -> None:  # noqa: B027 - optional hook
        """Generate with a training checkpoint from now on (``kind``: "lora" or "full"). A
        backend sharing the trainer's model in memory (``hf``) has it already."""

    def sleep(self) -> None:  # noqa: B027 - optional hook
        """Give the accelerator's memory to the trainer until :meth:`wake_up` (``vllm``'s sleep mode)."""

    def wake_up(self) -> None:  # noqa: B027 - optional hook
        """Take the memory back after :meth:`sleep`."""
