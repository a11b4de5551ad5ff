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
from mage.config.sections import EngineSection

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


def loads_checkpoints(engine: EngineSection, lora: bool) -> bool:
    """Whether a backend of ``engine`` in the trainer's process reads each new checkpoint from
    disk: a vLLM engine given a LoRA adapter, or full weights with ``weight_sync=disk``. hf
    generates with the trainer's model, and vLLM with ``memory`` takes the weights from it."""
    reads_its_files = lora or engine.vllm.weight_sync == "disk"  # what a vLLM engine would do
    return engine.backend == "vllm" and reads_its_files


def takes_weights_in_memory(engine: EngineSection) -> bool:
    """Whether a backend of ``engine`` in another process takes full weights sent through memory
    (:meth:`Backend.take_weights`) rather than reading the checkpoint: hf, or vLLM with
    ``weight_sync=memory``. A LoRA adapter always goes by its checkpoint."""
    return engine.backend == "hf" or engine.vllm.weight_sync == "memory"


def samples_from_a_given_model(engine: EngineSection) -> bool:
    """Whether a backend of ``engine`` generates with a torch model it is given (hf): whoever
    builds it holds the policy, and loads new weights into it. vLLM runs an engine of its own,
    and scripted needs no weights."""
    return engine.backend == "hf"


__all__ += ["loads_checkpoints", "make_backend", "samples_from_a_given_model", "takes_weights_in_memory"]
