"""Data-parallel updates: N processes share one PPO update.

:class:`PolicyTrainer` (``mage.trainer.policy_trainer``) runs the same update in one process or in N.
With N, set up by any launcher that initialises ``torch.distributed`` (Ray Train in the
``train`` flow, ``torchrun``, ``torch.multiprocessing`` in the tests), each process is one
rank and this module supplies what differs:

* :class:`Collective`: which rows of a mini-batch this rank trains (balanced by token count,
  the same split computed on every rank), the sums and maxima the ranks share, and the
  log-probs each rank scored, gathered so every rank holds every row's;
* :func:`wrap`: the trainer's forward module sharded with FSDP2 (``fully_shard`` on each
  decoder layer and on the root, which holds the embeddings, the final norm and the output
  layer) or replicated with DDP (``train.sharding``).

Every rank runs the same number of forward and backward passes (FSDP2 gathers each layer's
weights in every pass, DDP reduces at every synchronised backward): a rank with fewer
micro-batches runs filler passes whose loss is multiplied by zero. The loss of a micro-batch
is the token sum over the *whole* mini-batch's token count (``mage.algo.losses``), and FSDP2
and DDP average gradients over the ranks, so each rank's loss is scaled by the number of
ranks: the summed gradient is the single-process gradient. Clipping then sees the same norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: How N ranks hold the trained model (``train.sharding``).
SHARDINGS = ("fsdp", "ddp")


@dataclass(frozen=True)
class Collective:
    """This process's place among ``world`` ranks (``world`` 1: the update alone, no
    ``torch.distributed`` needed). ``device`` is where the collectives' tensors live (NCCL
    needs the GPU)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @classmethod
    def current(cls, device: torch.device) -> Collective:
        """This process's rank in the initialised default process group (or a lone process)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls(device=device)
        return cls(dist.get_rank(), dist.get_world_size(), device)

    def share(self, rows: Sequence[int], lengths: Sequence[int]) -> list[int]:
        """This rank's rows of ``rows``: longest first, each to the rank with the fewest tokens
        so far (ties: the lowest rank), so the ranks' token counts differ by at most one row.
        Every rank computes the same split; a rank's rows keep their order in ``rows``."""
        if self.world == 1:
            return list(rows)
        load = [0] * self.world
        owner = {}
        for row in sorted(rows, key=lambda r: (-lengths[r], r)):
            rank = min(range(self.world), key=lambda k: (load[k], k))
            owner[row] = rank
            load[rank] += lengths[row]
        return [row for row in rows if owner[row] == self.rank]

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        import torch.distributed as dist

        tensor = tensor.to(self.device)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.cpu()

    def most(self, value: int) -> int:
        """The largest ``value`` of any rank."""
        if self.world == 1:
            return value
        return int(self._all_reduce(torch.tensor([value], dtype=torch.int64), "MAX")[0])

    def largest(self, value: float) -> float:
        """The largest float ``value`` of any rank."""
        if self.world == 1:
            return value
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64), "MAX")[0])

    def total(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over the ranks (float64, in the keys' sorted order)."""
        if self.world == 1:
            return dict(values)
        keys = sorted(values)
        summed = self._all_reduce(torch.tensor([values[k] for k in keys], dtype=torch.float64), "SUM")
        return {key: float(v) for key, v in zip(keys, summed)}

    def gather(self, scored: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Every rank's ``{row: float32 values}``, merged (the rows are disjoint)."""
        if self.world == 1:
            return dict(scored)
        import torch.distributed as dist

        rows = sorted(scored)
        counts = torch.tensor([len(scored[r]) for r in rows], dtype=torch.int64)
        values = torch.cat([scored[r].float() for r in rows]) if rows else torch.zeros(0)
        sizes = torch.tensor([len(rows), len(values)], dtype=torch.int64, device=self.device)
        all_sizes = [torch.zeros_like(sizes) for _ in range(self.world)]
        dist.all_gather(all_sizes, sizes)
        most_rows = max(int(s[0]) for s in all_sizes)
        most_values = max(int(s[1]) for s in all_sizes)

        def padded(tensor: torch.Tensor, size: int) -> torch.Tensor:
            out = torch.zeros(size, dtype=tensor.dtype, device=self.device)
            out[: len(tensor)] = tensor.to(self.device)
            return out

        parts = {}
        for name, tensor, size in (("rows", torch.tensor(rows, dtype=torch.int64), most_rows),
                                   ("counts", counts, most_rows), ("values", values, most_values)):
            gathered = [torch.zeros(size, dtype=tensor.dtype, device=self.device) for _ in range(self.world)]
            dist.all_gather(gathered, padded(tensor, size))
            parts[name] = [g.cpu() for g in gathered]
        merged = {}
        for rank, size in enumerate(all_sizes):
            offset = 0
            for i in range(int(size[0])):
                row, count = int(parts["rows"][rank][i]), int(parts["counts"][rank][i])
                merged[row] = parts["values"][rank][offset : offset + count].clone()
                offset += count
        return merged


def wrap(module: torch.nn.Module, layers: Sequence[torch.nn.Module], sharding: str,
         collective: Collective) -> torch.nn.Module:
    """``module`` (the trainer's forward) for ``collective.world`` ranks: FSDP2 over ``layers``
    (the decoder layers) and the root, or DDP. One rank: ``module`` itself."""
    if sharding not in SHARDINGS:
        raise ValueError(f"train.sharding must be one of {SHARDINGS}, got {sharding!r}")
    if collective.world == 1:
        return module
    if sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [collective.device.index] if collective.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, broadcast_buffers=False)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(collective.device.type, (collective.world,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    # The root too frees its gathered weights after each pass (FSDP2 keeps the root's by default):
    # the trainer writes the reference weights into the shards between passes, and a root still
    # holding the current ones would score the reference with them.
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    return module


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: the local shard of an FSDP2 (DTensor) parameter, else
    the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_value(value: torch.Tensor) -> float:
    """A scalar that may be a DTensor (FSDP2's gradient norm), as a float every rank agrees on."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)
