"""The generation-backend interface shared by ``hf``, ``vllm`` and ``scripted``.

A backend takes a batch of :class:`GenerationRequest` (the user-message text of a prompt,
plus the game-side context that only the scripted backend reads) and
:class:`SamplingSection`, and returns one :class:`Generation` per request: the text, the
prompt's token ids as the model saw them (chat template applied), the response's token
ids and the log-probability of every sampled token.

Log-probs are the model's own: ``log_softmax`` of its raw logits at temperature 1, before
temperature, top-k or top-p reshape the sampling distribution. They are what a
teacher-forced forward pass of the same model gives, and at sampling temperature 1 what PPO's
ratio compares (the trainer recomputes its own, of ``softmax(logits / temperature)``; the
rollout's copy is for checks and diagnostics).

Stop strings follow the phase (:data:`mage.protocol.PHASE_STOP_STRINGS`, :meth:`SamplingSection.stop_for`): a play reply ends at ``</action>``, a
reflection at ``</remark>``, so a reflection that quotes ``<action>bet</action>`` in its plan
is not cut there. A stop string inside an open ``<think>`` block (Qwen3 thinking may quote
tags while deliberating) does not end the reply; every backend applies both rules.

Seeds: a request may carry its own ``seed`` (the engine derives one per meta-episode and
call), so the members of a group sample independently even when they share a prompt, and a
run repeats given its seed. ``SamplingSection.seed`` seeds a whole batch where a backend
cannot seed requests one by one (``hf``).

New weights: a backend that samples from a copy of the trainer's weights of its own (``vllm``'s
engine) says how it gets each update's (:attr:`Backend.weight_sync`): through memory
(:meth:`Backend.take_weights`, then :meth:`Backend.name_weights` once they are a checkpoint's)
or from the checkpoint (:meth:`Backend.load_checkpoint`). Either way it is then checked
(:meth:`Backend.check_weights`): its log-probs of a small probe must equal the trainer's, or
the run stops (:class:`mage.backends.weight_sync.StaleWeightsError`). One that samples with a
model in this process's memory (``hf``: the trainer's own) or with none (``scripted``) has
nothing to take or check. The run layer asks these hooks, never which backend it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mage.config.sections import SamplingSection
from mage.protocol import PHASE_STOP_STRINGS, STOP_STRINGS, THINK_CLOSE, THINK_OPEN

if TYPE_CHECKING:
    from mage.backends.weight_sync import Encoded, Probe

__all__ = ["PHASE_STOP_STRINGS", "STOP_STRINGS", "THINK_CLOSE", "THINK_OPEN", "Backend", "Generation",
           "GenerationRequest", "SamplingSection", "prompt_opens_thinking", "thinking_open"]


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
    #: How the trainer's new weights reach the copy of them this backend samples from:
    #: ``"memory"`` (:meth:`take_weights`; full weights, a LoRA adapter still comes by its
    #: checkpoint) or ``"disk"`` (:meth:`load_checkpoint`), each then :meth:`check_weights`. None:
    #: it holds no copy of its own (``hf`` samples with the model it was given, ``scripted`` with
    #: none), so there is nothing to take or check.
    weight_sync: Literal["memory", "disk"] | None = None

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSection) -> list[Generation]:
        """Answer every request; the result is in request order."""

    @abstractmethod
    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        """Tokens each prompt takes once formatted for the model (chat template included)."""

    def joins(self, others: Sequence[Backend]) -> bool:
        """Whether :meth:`generate_joint` answers the requests of ``others`` (with this
        backend's) in one batch: ``vllm``'s views of one engine on the same base weights."""
        return False

    def generate_joint(self, batches: Sequence[tuple[Backend, Sequence[GenerationRequest]]],
                       sampling: SamplingSection) -> list[list[Generation]]:
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

    # -- new weights, and the check that it serves them (see the module docstring) --------------
    def take_weights(self, chunks: Iterable[list[Encoded]]) -> dict[str, Any]:
        """Generate with these full weights from now on: a model's ``state_dict`` as
        :func:`mage.backends.weight_sync.encoded` chunks, sent through memory, no file. Untrusted
        until :meth:`check_weights` passes; unnamed until :meth:`name_weights`. Returns what was
        taken (``tensors``) and the ``seconds`` it took. A backend with no copy of the weights of
        its own (:attr:`weight_sync` None) takes none: TypeError."""
        raise TypeError(f"a {type(self).__name__} takes no weights through memory")

    def name_weights(self, checkpoint: str) -> bool:
        """The weights taken last (:meth:`take_weights`) are those of ``checkpoint``: held under
        its name from now on, with no load (a later request for that checkpoint finds them).
        False where the backend generates with no weights taken so (by default, always)."""
        return False

    def check_weights(self, probe: Probe, expected: Sequence[Sequence[float]], what: str) -> float:
        """The largest gap between this backend's log-probs of ``probe`` (:meth:`logprobs_of`)
        and ``expected``, the trainer's; above the backend's tolerance, a
        :class:`~mage.backends.weight_sync.StaleWeightsError` that names ``what`` it was to serve.
        A backend with no copy of the weights of its own (:attr:`weight_sync` None) has nothing
        to check: TypeError."""
        raise TypeError(f"a {type(self).__name__} holds no weights of its own to check")

    def logprobs_of(self, probe: Probe) -> list[list[float]]:
        """The policy's log-probs (temperature 1, teacher-forced) of each probe sequence's scored
        tokens: what :meth:`check_weights` compares, and how a policy is read (exploitability)."""
        raise TypeError(f"{type(self).__name__} has no model to read log-probs from")

    def sleep(self) -> None:  # noqa: B027 - optional hook
        """Give the accelerator's memory to the trainer until :meth:`wake_up` (``vllm``'s sleep mode)."""

    def wake_up(self) -> None:  # noqa: B027 - optional hook
        """Take the memory back after :meth:`sleep`."""
