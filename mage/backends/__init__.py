"""Generation backends: ``hf`` (transformers), ``vllm`` (GPU extra) and ``scripted``."""

from mage.backends.base import (
    PHASE_STOP_STRINGS,
    STOP_STRINGS,
    Backend,
    Generation,
    GenerationRequest,
    SamplingSection,
    thinking_open,
)

__all__ = ["PHASE_STOP_STRINGS", "STOP_STRINGS", "Backend", "Generation", "GenerationRequest", "SamplingSection",
           "thinking_open"]


def make_backend(kind: str, **options: object) -> Backend:
    """Build a backend by name: ``hf``, ``vllm`` or ``scripted`` (imports only what it needs)."""
    if kind == "hf":
        from mage.backends.hf import HFBackend

        return HFBackend(**options)  # type: ignore[arg-type]
    if kind == "vllm":
        from mage.backends.vllm import VLLMBackend

        return VLLMBackend(**options)  # type: ignore[arg-type]
    if kind == "scripted":
        from mage.backends.scripted import ScriptedBackend

        return ScriptedBackend(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend {kind!r}; known backends: ['hf', 'scripted', 'vllm']")


__all__ += ["make_backend"]
