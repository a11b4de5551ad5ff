"""Chat formatting shared by the backends (kept free of torch imports)."""

from __future__ import annotations

from typing import Any


def format_prompt(tokenizer: Any, prompt: str, chat: bool = True, enable_thinking: bool | None = None) -> str:
    """The text the model sees: the chat template around one user message, if it has one.

    ``enable_thinking`` is passed to templates that know it (Qwen3); None leaves the
    template's default.
    """
    if not chat or not getattr(tokenizer, "chat_template", None):
        return prompt
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, **extra
    )
