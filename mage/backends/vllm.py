"""The ``vllm`` backend (GPU machines; ``pip install -e .[gpu]``).

Same contract as ``hf``: the chat template is applied here with the model's own tokenizer
and the prompt goes to vLLM as token ids, so both backends feed the model identical
tokens. Prefix caching is on: the prompts of a meta-episode share long prefixes (rules,
initial state, earlier episodes). LoRA adapters come as ``LoRARequest``. Log-probs are
vLLM's default ``raw_logprobs`` mode: the model's log-softmax before temperature and
top-k/top-p, which is what ``hf`` records and the trainer recomputes. Written against
vLLM 0.33.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage.backends.base import Backend, Generation, GenerationRequest, SamplingSettings
from mage.backends.chat import format_prompt


class VLLMBackend(Backend):
    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
        adapter: str | Path | None = None,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        max_lora_rank: int = 64,
        chat: bool = True,
        enable_thinking: bool | None = None,
        seed: int = 0,
        **engine_args: Any,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as error:  # pragma: no cover - depends on the machine
            raise ImportError(
                "the vllm backend needs the GPU extra: pip install -e '.[gpu]' on a machine with a CUDA GPU"
            ) from error
        self.llm = LLM(
            model=str(model),
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,
            enable_lora=adapter is not None,
            max_lora_rank=max_lora_rank,
            logprobs_mode="raw_logprobs",
            seed=seed,
            **engine_args,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.chat, self.enable_thinking = chat, enable_thinking
        self.max_context_tokens = int(self.llm.model_config.max_model_len)
        self._adapter_version = 0
        self.lora_request = None
        if adapter is not None:
            self.set_adapter(adapter)

    def set_adapter(self, adapter: str | Path) -> None:
        """Serve a new LoRA adapter (a new id, so vLLM does not reuse the cached old one)."""
        from vllm.lora.request import LoRARequest

        self._adapter_version += 1
        self.lora_request = LoRARequest(f"adapter-{self._adapter_version}", self._adapter_version, str(adapter))

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        texts = [format_prompt(self.tokenizer, p, self.chat, self.enable_thinking) for p in prompts]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode(prompts)]

    def sampling_params(self, sampling: SamplingSettings) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 switches top-k off in vLLM as here
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop),
            include_stop_str_in_output=True,  # the closing tag is part of the reply, as in hf
            logprobs=0,  # only the sampled token's log-prob
            seed=sampling.seed,
        )

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> list[Generation]:
        if not requests:
            return []
        from vllm import TokensPrompt

        prompt_ids = self.encode([r.prompt for r in requests])
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
            self.sampling_params(sampling),
            lora_request=self.lora_request,
            use_tqdm=False,
        )
        results = []
        for ids, output in zip(prompt_ids, outputs):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
            results.append(
                Generation(
                    text=completion.text,
                    prompt_token_ids=list(ids),
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason="length" if completion.finish_reason == "length" else "stop",
                )
            )
        return results

    def close(self) -> None:
        del self.llm
