"""The ``hf`` backend: batched sampling with transformers' ``generate`` on CPU or GPU.

Prompts are formatted with the tokenizer's chat template (Qwen3 thinking on or off),
sorted by length and cut into micro-batches with left padding, so short prompts are not
padded to the longest of the whole batch. A model's own sampling defaults never apply:
transformers fills every field that the call's ``GenerationConfig`` leaves unset from the
model's ``generation_config`` (a Qwen's sets a repetition penalty, top-k, top-p and more),
then from its global defaults (top-k 50). So the backend sets temperature, top-p and top-k
itself (``top_k=0``: off, not transformers' 50) and hides the model's config during the call:
the replies are samples of ``softmax(logits / temperature)`` with only the filters asked for.

Two small hooks ride along ``generate``:

* :class:`_RawLogProbs`, a logits processor that runs before the sampling warpers, keeps
  the ``log_softmax`` of the raw logits of the current step only, and gathers the sampled
  token's log-prob one step later (memory: one ``batch x vocab`` tensor, not one per step);
* :class:`_FinishRecorder`, a stopping criterion wrapping transformers' own
  ``StopStringCriteria``, records where each sequence ended (stop string or end of
  sequence), so padding after the end is never mistaken for response tokens. A stop string
  completed inside an open ``<think>`` block is ignored (the row's text is decoded only
  when a stop string fires, which is rare).

A micro-batch decodes until its last row ends, and every step costs in proportion to its
rows. When only a few rows are still going (a reply rambling to the token limit while the
others stopped after a few tokens), the recorder pauses ``generate`` and those rows go on
as a smaller batch from where they were (:data:`REGROUP_SHARE`). Each row's tokens are
sampled from the same distributions either way; only the random draws differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from mage.backends.base import (
    Backend,
    Generation,
    GenerationRequest,
    SamplingSection,
    prompt_opens_thinking,
    thinking_open,
)
from mage.backends.chat import format_prompt
from mage.tensors import DTYPES, common_prefix_length, teacher_forced_shared

if TYPE_CHECKING:
    from mage.backends.vllm_sync import Probe


class _RawLogProbs(LogitsProcessor):
    """Records log p(sampled token) under the raw logits, one step behind the sampler."""

    def __init__(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length
        self.previous: torch.Tensor | None = None  # log_softmax of the last step's raw logits
        self.steps: list[torch.Tensor] = []

    def gather(self, sampled: torch.Tensor) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, sampled[:, None]).squeeze(1))
            self.previous = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] > self.prompt_length:
            self.gather(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, sequences: torch.Tensor) -> torch.Tensor:
        """[batch, generated] log-probs once generation is over."""
        self.gather(sequences[:, -1])
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(sequences.shape[0], 0)


#: A micro-batch pauses once at most this share of its rows is still decoding, and those rows
#: go on alone. On the tiny preset a decode step of 64 rows took 29 ms and one of 4 rows 5 ms
#: (at 725e859, in the history of BENCHMARKS.md: ``git show 84715c9:BENCHMARKS.md``), and a
#: reply in 16 of the Tic-Tac-Toe warm start's runs to the 128-token limit, so nearly every
#: micro-batch of 64 decoded all 128 steps for a few rows. The gain: BENCHMARKS.md, "Regrouped
#: decoding in the hf backend".
REGROUP_SHARE = 0.25
#: ... and only with this many tokens of the budget left: the rows' prompts are prefilled again.
REGROUP_MIN_TOKENS_LEFT = 16


class _FinishRecorder(StoppingCriteria):
    """Stops on stop strings or end of sequence and records each sequence's length.

    ``reply_start``: where the replies begin in ``input_ids`` (before ``prompt_length`` when
    the rows carry tokens from an earlier pause); ``pause_rows``: pause ``generate`` once at
    most this many rows are running, with ``max_length`` as the budget's end (0: never).
    """

    def __init__(self, stop: StopStringCriteria | None, eos_ids: Sequence[int], prompt_length: int, batch: int,
                 tokenizer: Any, thinking_at_start: Sequence[bool], *, reply_start: int, pause_rows: int,
                 max_length: int) -> None:
        self.stop, self.prompt_length, self.tokenizer, self.reply_start = stop, prompt_length, tokenizer, reply_start
        self.eos_ids = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self.lengths = torch.full((batch,), -1, dtype=torch.long)
        self.thinking_at_start = list(thinking_at_start)
        self.pause_rows, self.max_length, self.paused = pause_rows, max_length, False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = torch.isin(input_ids[:, -1].cpu(), self.eos_ids)
        if self.stop is not None:
            stopped = self.stop(input_ids, scores).cpu() & (self.lengths < 0)
            for row in torch.nonzero(stopped).flatten().tolist():
                reply = self.tokenizer.decode(input_ids[row, self.reply_start :], skip_special_tokens=True)
                if thinking_open(reply, self.thinking_at_start[row]):
                    stopped[row] = False  # a tag quoted while thinking
            done |= stopped
        newly = done & (self.lengths < 0)
        self.lengths[newly] = input_ids.shape[1] - self.prompt_length
        running = int((self.lengths < 0).sum())
        if 0 < running <= self.pause_rows and self.max_length - input_ids.shape[1] >= REGROUP_MIN_TOKENS_LEFT:
            self.paused = True
            return torch.ones_like(done).to(input_ids.device)
        return (self.lengths >= 0).to(input_ids.device)


def _to_static(cache: Any, rows: torch.Tensor, config: Any, max_length: int) -> Any:
    """Copy a dynamic cache's ``rows`` (repeats allowed) into a preallocated StaticCache."""
    from transformers import StaticCache

    static = StaticCache(config=config, max_cache_len=max_length)
    for target, source in zip(static.layers, cache.layers):
        keys, values = source.keys.index_select(0, rows), source.values.index_select(0, rows)
        target.lazy_initialization(keys, values)
        length = keys.shape[2]
        target.keys[:, :, :length].copy_(keys)
        target.values[:, :, :length].copy_(values)
        target.cumulative_length.fill_(length)
    return static


#: Encoded prompts kept between the engine's count and its generation of the same step.
ENCODED_PROMPTS_KEPT = 4096


@contextmanager
def _without_model_defaults(model: Any) -> Iterator[None]:
    """Hide the model's own ``generation_config`` from ``generate`` (see the module docstring);
    it is put back on the way out, exception or not. ``generate`` reads the config of the
    transformers model, which a peft wrapper holds. Not reentrant: the flows run one rollout
    on a model at a time (``tasks.worker.LOCK``)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved, inner.generation_config = inner.generation_config, GenerationConfig()
    try:
        yield
    finally:
        inner.generation_config = saved


class HFBackend(Backend):
    """transformers backend; ``model`` may be a path, a hub name or a loaded model."""

    name = "hf"

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
        *,
        adapter: str | Path | None = None,
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int = 64,
        chat: bool = True,
        enable_thinking: bool | None = None,
        share_prefill: bool = True,
        regroup: bool = True,
    ) -> None:
        if not isinstance(model, (str, Path)):
            # A model handed over (the tiny build's, mid-training) is used where it lies: moving
            # it would move its owner's model too, and inputs sent elsewhere fail at generation.
            on = next(model.parameters()).device
            asked = torch.device(device) if device is not None else on
            if asked.type != on.type or asked.index not in (None, on.index):
                raise ValueError(f"HFBackend: device {device!r} was asked for, but the model given is on {on}; "
                                 "move the model there first, or leave device out")
            self.device = on
        else:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            source = str(model)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype]).to(self.device)
            tokenizer = tokenizer or source
        if tokenizer is None:
            raise ValueError("a loaded model needs its tokenizer")
        if isinstance(tokenizer, (str, Path)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter)).to(self.device)
        self.model, self.tokenizer = model, tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token for batched generation")
        self.batch_size, self.chat, self.enable_thinking = batch_size, chat, enable_thinking
        self.share_prefill, self.regroup = share_prefill, regroup
        self.max_context_tokens = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._stop_cache: dict[tuple[str, ...], StopStringCriteria] = {}
        self._encoded: dict[str, list[int]] = {}

    # -- prompts ---------------------------------------------------------------------------
    def format(self, prompt: str) -> str:
        return format_prompt(self.tokenizer, prompt, self.chat, self.enable_thinking)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of the formatted prompts. The engine counts a step's prompts just before
        generating them, so the ids are kept briefly instead of being computed twice."""
        missing = sorted({p for p in prompts if p not in self._encoded})
        if missing:
            if len(self._encoded) + len(missing) > ENCODED_PROMPTS_KEPT:
                # forget the older prompts, never the ones this call is about to return
                wanted = set(prompts)
                self._encoded = {p: ids for p, ids in self._encoded.items() if p in wanted}
            ids = self.tokenizer([self.format(p) for p in missing], add_special_tokens=False)["input_ids"]
            self._encoded.update(zip(missing, ids))
        return [list(self._encoded[p]) for p in prompts]

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode(prompts)]

    def logprobs_of(self, probe: Probe) -> list[list[float]]:
        """A teacher-forced pass of the model it generates with, the prompts shared by several
        sequences run once (:func:`mage.tensors.teacher_forced_shared`: reading a policy asks for
        every legal reply after the same prompt)."""
        return teacher_forced_shared(self.model, probe.tokens, probe.scored)

    # -- generation ------------------------------------------------------------------------
    def _stop_criteria(self, stop: tuple[str, ...]) -> StopStringCriteria | None:
        # Building the criterion preprocesses the whole vocabulary: do it once per stop set.
        if not stop:
            return None
        if stop not in self._stop_cache:
            self._stop_cache[stop] = StopStringCriteria(self.tokenizer, list(stop))
        return self._stop_cache[stop]

    def _generation_config(self, sampling: SamplingSection, max_new_tokens: int) -> GenerationConfig:
        greedy = sampling.temperature == 0
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else sampling.top_k,  # 0, not None: None would mean transformers' 50
            max_new_tokens=max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self._eos_ids(),
        )

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        ids |= set(configured if isinstance(configured, list) else [configured])
        return sorted(i for i in ids if i is not None)

    def _layout(self, prompt_ids: list[list[int]]) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Right-aligned rows: shared prefix, left padding, then each prompt's own suffix.

        Returns the shared prefix length and the [batch, width] token ids and attention mask.
        Without prefill sharing (or a shared prefix) this is plain left padding.
        """
        shared = common_prefix_length(prompt_ids) if self.share_prefill and len(prompt_ids) > 1 else 0
        shared = min(shared, min(len(ids) for ids in prompt_ids) - 1)  # every row keeps >= 1 own token
        suffixes = [ids[shared:] for ids in prompt_ids]
        longest = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id
        prefix = prompt_ids[0][:shared]
        rows = [prefix + [pad] * (longest - len(s)) + s for s in suffixes]
        mask = [[1] * shared + [0] * (longest - len(s)) + [1] * len(s) for s in suffixes]
        return shared, torch.tensor(rows, device=self.device), torch.tensor(mask, device=self.device)

    def _shared_prefill(
        self, prompt_ids: list[list[int]], shared: int, input_ids: torch.Tensor, mask: torch.Tensor, max_length: int
    ):
        """KV cache of every row but its last token, computing shared work once.

        The prefix common to all rows is run once (batch 1); identical prompts (frequent:
        a GiGPO group starts from one state) are run once each. The cache is then copied
        out to all rows of a preallocated static cache of ``max_length`` tokens, so
        decoding writes in place instead of concatenating a growing cache every step, and
        ``generate`` only has to process each row's last token. This is what vLLM's prefix
        caching does; a sequential loop has nothing to share.
        """
        from transformers import DynamicCache

        unique: dict[tuple[int, ...], int] = {}
        owner = [unique.setdefault(tuple(ids), len(unique)) for ids in prompt_ids]
        first_rows = torch.tensor([owner.index(u) for u in range(len(unique))], device=self.device)
        cache = DynamicCache(config=self.model.config)
        # Prefill wants the keys and values only: logits_to_keep=1 instead of a [rows, tokens,
        # vocab] tensor (64 prompts of 600 tokens x Qwen's 152k vocabulary: 12 GB in bf16).
        if shared:
            self.model(input_ids=input_ids[:1, :shared], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(unique))
        width = input_ids.shape[1]
        if width - 1 > shared:
            rows_mask = mask[first_rows, : width - 1]
            positions = (rows_mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
            self.model(
                input_ids=input_ids[first_rows, shared : width - 1],
                attention_mask=rows_mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return _to_static(cache, torch.tensor(owner, device=self.device), self.model.config, max_length)

    @torch.inference_mode()
    def _generate_batch(self, prompt_ids: list[list[int]], sampling: SamplingSection, phase: str) -> list[Generation]:
        """One micro-batch: decoded in one ``generate`` call, or in several when it regroups."""
        opened = [prompt_opens_thinking(self.tokenizer, ids) for ids in prompt_ids]
        tokens: list[list[int]] = [[] for _ in prompt_ids]
        logprobs: list[list[float]] = [[] for _ in prompt_ids]
        reasons = ["length"] * len(prompt_ids)
        running = list(range(len(prompt_ids)))
        while running:
            spent = len(tokens[running[0]])  # rows still running have all decoded every step so far
            pause_rows = int(len(running) * REGROUP_SHARE) if self.regroup else 0
            new_tokens, new_logprobs, ended, paused = self._decode(
                [prompt_ids[i] + tokens[i] for i in running], [opened[i] for i in running], sampling, phase, spent,
                pause_rows)
            for row, index in enumerate(running):
                tokens[index] += new_tokens[row]
                logprobs[index] += new_logprobs[row]
                if ended[row]:
                    reasons[index] = "stop"
            running = [index for row, index in enumerate(running) if paused and not ended[row]]
        return [
            Generation(
                text=self.tokenizer.decode(tokens[i], skip_special_tokens=True),
                prompt_token_ids=list(ids),
                token_ids=tokens[i],
                logprobs=logprobs[i],
                finish_reason=reasons[i],
            )
            for i, ids in enumerate(prompt_ids)
        ]

    def _decode(
        self, rows: list[list[int]], opened: list[bool], sampling: SamplingSection, phase: str, spent: int,
        pause_rows: int,
    ) -> tuple[list[list[int]], list[list[float]], list[bool], bool]:
        """One ``generate`` call over ``rows`` (prompts, then ``spent`` reply tokens each).

        Returns each row's new tokens, their log-probs and whether the row ended (stop string or
        end of sequence), and whether the call paused to regroup (``pause_rows``) rather than
        ending at the token limit or with every row ended.
        """
        shared, input_ids, attention = self._layout(rows)
        width = input_ids.shape[1]
        left = sampling.max_new_tokens - spent
        recorder = _RawLogProbs(width)
        finish = _FinishRecorder(self._stop_criteria(sampling.stop_for(phase)), self._eos_ids(), width, len(rows),
                                 self.tokenizer, opened, reply_start=width - spent, pause_rows=pause_rows,
                                 max_length=width + left)
        generation_config = self._generation_config(sampling, left)
        was_training = self.model.training
        self.model.eval()
        try:
            extra = {}
            if self.share_prefill and width > 1:
                extra["past_key_values"] = self._shared_prefill(rows, shared, input_ids, attention, width + left)
            with _without_model_defaults(self.model):
                sequences = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    generation_config=generation_config,
                    logits_processor=LogitsProcessorList([recorder]),
                    stopping_criteria=StoppingCriteriaList([finish]),
                    **extra,
                )
        finally:
            self.model.train(was_training)
        logprobs = recorder.logprobs(sequences).cpu()
        generated = sequences[:, width:].cpu()
        lengths = [int(n) if n >= 0 else generated.shape[1] for n in finish.lengths]
        new_tokens = [generated[row, :n].tolist() for row, n in enumerate(lengths)]
        new_logprobs = [logprobs[row, :n].tolist() for row, n in enumerate(lengths)]
        ended = [bool(n >= 0) for n in finish.lengths]
        return new_tokens, new_logprobs, ended, finish.paused

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSection) -> list[Generation]:
        if not requests:
            return []
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        prompt_ids = self.encode([r.prompt for r in requests])
        # A micro-batch decodes until its longest reply stops (regrouping only trims the rows
        # that wait), so replies of one phase go together (an action is a few tokens, a
        # reflection dozens: mixed, every action row would wait out the reflections), and
        # similar prompt lengths share a micro-batch (little padding).
        order = sorted(range(len(prompt_ids)), key=lambda i: (requests[i].phase, len(prompt_ids[i])))
        chunks: list[list[int]] = []
        for _, same_phase in itertools.groupby(order, key=lambda i: requests[i].phase):
            rows = list(same_phase)
            chunks += [rows[start : start + self.batch_size] for start in range(0, len(rows), self.batch_size)]
        results: list[Generation | None] = [None] * len(prompt_ids)
        for chunk in chunks:
            batch = self._generate_batch([prompt_ids[i] for i in chunk], sampling, requests[chunk[0]].phase)
            for index, generation in zip(chunk, batch):
                results[index] = generation
        return results  # type: ignore[return-value]
