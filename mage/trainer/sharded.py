"""One update on N ranks, from a checkpoint to a checkpoint's state: what each Ray Train worker
runs (``tasks.ray.update``), and what any other launcher of ``torch.distributed`` can run.

:func:`run_update` builds the policy on the base weights (full fine-tuning's reference), shards
it (:mod:`mage.trainer.distributed`), loads the state it resumes from, runs
:meth:`PolicyTrainer.update` on the scored table and writes the new state to ``out``:

* ``out/trainer_state/``: the trained weights and AdamW's moments, sharded, written by every
  rank with ``torch.distributed.checkpoint`` as safetensors files (its Hugging Face storage:
  the plan travels in the files' headers, nothing is pickled). Any number of ranks reads it
  back (:func:`load_state`): a run resumes with more or fewer workers, or in one process.
* ``out/weights.safetensors``: rank 0's gathered copy of the trained tensors (full fine-tuning:
  every weight; LoRA: the adapter), by their names in the policy's model, which the driver loads
  into its policy for the rollouts and the checkpoint's ordinary model directory or adapter.

A one-process checkpoint (``trainer_state.safetensors``, :mod:`mage.models.checkpoint`) is
continued on workers through a sharded state written once from it: the driver loads it as one
process would continue it and writes that state (:func:`write_state`, in
:func:`mage.run.state.start_training`), which the workers then read as any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mage import io
from mage.models.checkpoint import SHARDED_STATE
from mage.trainer.distributed import Collective

#: Rank 0's gathered trained tensors.
WEIGHTS = "weights.safetensors"
#: Beside them: what wrote them (the ranks, the tensors' names), in JSON.
RECORD = "update.json"
_OPTIMIZER = "optimizer."


@dataclass(frozen=True)
class UpdateJob:
    """One update: the settings, the scored table, the checkpoint it continues (None: the base
    model), where the new state goes, and the update's seed and learning rate."""

    settings: Any  # mage.settings.Settings (this module sits below mage.settings' users)
    iteration: int
    table: str
    resume: str | None
    out: str
    seed: int
    learning_rate: float


def _trained_names(model: torch.nn.Module) -> list[str]:
    # named_parameters lists a tied weight once (the output layer shares the input table)
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, strict=False, **kwargs)


def _state(trainer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trained tensors and the flattened optimizer state, each tensor once."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(trainer.model, trainer.optimizer, options=_options())
    names = set(_trained_names(trainer.model))
    tensors = {name: value for name, value in model_state.items() if name in names}
    tensors |= {_OPTIMIZER + key: value for key, value in optimizer_state.items()
                if torch.is_tensor(value) and key.startswith("state.")}
    return tensors, optimizer_state


def write_state(trainer, out: str | Path) -> Path:
    """Every rank (or one process): the trained weights and the optimizer's moments as a sharded
    state, ``out/trainer_state``, which any number of ranks reads back (:func:`load_state`)."""
    import torch.distributed.checkpoint as dcp

    directory = Path(out) / SHARDED_STATE
    _materialise_optimizer(trainer)  # a weight that has had no gradient yet still has its moments
    tensors, _ = _state(trainer)
    dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(str(directory), save_distributed=True))
    return directory


def save_state(trainer, out: str | Path) -> None:
    """Every rank: the sharded state into ``out/trainer_state``; rank 0 also the gathered trained
    tensors (``out/weights.safetensors``) and ``out/update.json``."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    out = Path(out)
    write_state(trainer, out)
    full = get_model_state_dict(trainer.model, options=_options(full_state_dict=True, cpu_offload=True))
    if trainer.collective.rank == 0:
        trained = {name: full[name].detach().contiguous() for name in _trained_names(trainer.model)}
        io.atomic_write(out / WEIGHTS, lambda tmp: save_file(trained, tmp))
        record = {"ranks": trainer.collective.world, "sharding": trainer.train_cfg.sharding,
                  "tensors": sorted(trained), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        io.write_json(out / RECORD, record)


def load_state(trainer, directory: str | Path) -> None:
    """Every rank: the weights and optimizer state under ``directory``: a sharded state
    (``trainer_state/``, written by any number of ranks) or a one-process checkpoint's."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    directory = Path(directory)
    if not (directory / SHARDED_STATE).is_dir():
        refuse_one_process(directory)
    import torch.distributed.checkpoint as dcp

    _materialise_optimizer(trainer)
    tensors, optimizer_state = _state(trainer)
    dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(directory / SHARDED_STATE)))
    model_state = {k: v for k, v in tensors.items() if not k.startswith(_OPTIMIZER)}
    optimizer_state |= {k[len(_OPTIMIZER):]: v for k, v in tensors.items() if k.startswith(_OPTIMIZER)}
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                   options=_options())


def _materialise_optimizer(trainer) -> None:
    """AdamW creates its moments at its first step: create them (zeros, step 0) so that a
    loaded state has tensors to land in."""
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            state = trainer.optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def refuse_one_process(directory: str | Path) -> None:
    """The error for a one-process checkpoint handed to the ranks as it is (the driver converts
    one first: :func:`mage.run.state.start_training`)."""
    raise ValueError(f"train.workers: {directory} was written by one process (train.workers=1): the ranks read a "
                     f"sharded state; write one from it first (mage.trainer.sharded.write_state, as "
                     f"mage.run.state.start_training does)")


def run_update(job: UpdateJob) -> dict[str, float]:
    """Every rank (``torch.distributed`` initialised, or a lone process): the update of ``job``,
    its state written to ``job.out``; returns the update's metrics (every rank the same)."""
    import polars as pl

    from mage.models.policy import load_run_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    settings = job.settings
    torch.manual_seed(settings.train.seed)  # a fresh LoRA adapter, as mage.run.state.start_training draws it
    policy = load_run_policy(settings)
    collective = Collective.current(policy.device)
    trainer = PolicyTrainer(policy, settings.train, settings.algo, temperature=settings.engine.sampling.temperature,
                            collective=collective)
    if job.resume is not None:
        load_state(trainer, job.resume)
    table = pl.read_parquet(job.table)  # the scored table score_rollout wrote (and validated)
    metrics = trainer.update(table, seed=job.seed, learning_rate=job.learning_rate, policy_version=job.iteration - 1)
    save_state(trainer, job.out)
    return metrics


def load_trained(policy, out: str | Path) -> None:
    """Rank 0's gathered trained tensors (``out/weights.safetensors``) into ``policy`` (the
    driver's, for rollouts and the checkpoint's model files)."""
    from safetensors.torch import load_file

    path = Path(out) / WEIGHTS
    try:
        trained = load_file(path)
    except Exception as error:  # a missing or torn file: name it
        raise io.CorruptFileError(path, f"not a readable safetensors file ({error})",
                                  "the update did not finish: run the iteration again") from None
    names = set(_trained_names(policy.model))
    if set(trained) != names:
        raise ValueError(f"{path}: its tensors are not the policy's trained ones "
                         f"(missing {sorted(names - set(trained))[:5]}, unexpected {sorted(set(trained) - names)[:5]})")
    policy.model.load_state_dict(trained, strict=False)  # the others are frozen: the base model's
