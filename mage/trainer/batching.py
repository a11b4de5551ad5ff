"""Turning trajectory rows into micro-batches of token tensors.

A sequence is a call's prompt tokens followed by its response tokens; only response
tokens carry a loss. Rows are laid out right-aligned (left padding), so every response
ends at the last column and the model only needs logits for the last ``K + 1`` positions
(``logits_to_keep``), K being the longest response of the micro-batch: no LM-head work is
spent on prompt tokens.

Rows of a micro-batch usually share a long prompt prefix (the rules, the situation). With
``share_prefix`` the layout is ``[shared prefix][left padding][own suffix]``: the model runs
the prefix once and copies its keys and values to every row (gradients flow back through
the copy), so the prefix costs one row's work instead of B rows'. The shared part stops
before each row's last prompt token, so every logit that scores a response token comes
from the per-row pass.

Two ways to cut a mini-batch into micro-batches:

* ``bucketed`` (default): rows sorted by length, micro-batches filled up to a budget of
  padded tokens, so a micro-batch holds sequences of similar length and padding stays small;
* ``padded``: a fixed number of rows in sampling order, each micro-batch padded to its
  longest row (the baseline the training benchmark compares against).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mage.config.sections import BATCHINGS
from mage.tensors import common_prefix_length


@dataclass
class MicroBatch:
    rows: list[int]  # indices into the mini-batch's rows
    input_ids: torch.Tensor  # [B, W]
    attention_mask: torch.Tensor  # [B, W]
    position_ids: torch.Tensor  # [B, W]
    targets: torch.Tensor  # [B, K]: the last K tokens (responses, right-aligned)
    response_mask: torch.Tensor  # [B, K]: 1 on response tokens
    keep: int  # logits_to_keep = K + 1
    shared: int = 0  # leading tokens common to every row, run once

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def collate(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    rows: list[int],
    pad_id: int,
    share_prefix: bool = False,
    min_shared: int = 32,
) -> MicroBatch:
    shared = 0
    if share_prefix and len(rows) > 1:
        shared = min(common_prefix_length([prompts[i] for i in rows]), min(len(prompts[i]) for i in rows) - 1)
        shared = shared if shared >= min_shared else 0
    suffixes = [list(prompts[i][shared:]) + list(responses[i]) for i in rows]
    width = shared + max(len(s) for s in suffixes)
    longest_response = max(max(len(responses[i]) for i in rows), 1)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    response_mask = torch.zeros((len(rows), longest_response), dtype=torch.long)
    if shared:
        input_ids[:, :shared] = torch.tensor(list(prompts[rows[0]][:shared]), dtype=torch.long)
        attention[:, :shared] = 1
    for r, (i, suffix) in enumerate(zip(rows, suffixes)):
        input_ids[r, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        attention[r, width - len(suffix) :] = 1
        if responses[i]:
            response_mask[r, longest_response - len(responses[i]) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        rows=list(rows),
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        targets=input_ids[:, width - longest_response :],
        response_mask=response_mask,
        keep=longest_response + 1,
        shared=shared,
    )


def micro_batches(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    batching: str = "bucketed",
    token_budget: int = 16384,
    rows_per_batch: int = 8,
    share_prefix: bool = False,
) -> list[MicroBatch]:
    """Cut all rows into micro-batches (see the module docstring)."""
    if batching not in BATCHINGS:
        raise ValueError(f"batching must be one of {BATCHINGS}, got {batching!r}")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    groups: list[list[int]] = []
    if batching == "padded":
        order = list(range(len(lengths)))
        groups = [order[i : i + rows_per_batch] for i in range(0, len(order), rows_per_batch)]
    else:
        current: list[int] = []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            width = max([lengths[j] for j in current] + [lengths[i]])
            if current and width * (len(current) + 1) > token_budget:
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
    return [collate(prompts, responses, g, pad_id, share_prefix) for g in groups]


def output_layer(model) -> torch.nn.Module:
    """The model's output layer (the LM head), under a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()


def causal_lm_forward(model, batch: MicroBatch, device, hidden: bool = False) -> torch.Tensor:
    """Logits of the last ``batch.keep`` positions, running a shared prefix only once. With
    ``hidden``, the decoder's last hidden states there instead (after its final norm), for an
    output layer applied in chunks (:mod:`mage.trainer.logprobs`)."""
    base = model.get_base_model() if hidden and hasattr(model, "get_base_model") else model
    net = base.get_decoder() if hidden else model
    keep = {} if hidden else {"logits_to_keep": batch.keep}
    input_ids = batch.input_ids.to(device)
    attention = batch.attention_mask.to(device)
    positions = batch.position_ids.to(device)
    if not batch.shared:
        out = net(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=False, **keep)
        return out.last_hidden_state[:, -batch.keep:] if hidden else out.logits
    from transformers import DynamicCache

    cache = DynamicCache(config=getattr(base, "config", None))
    net(input_ids=input_ids[:1, : batch.shared], position_ids=positions[:1, : batch.shared], past_key_values=cache,
        use_cache=True, **({} if hidden else {"logits_to_keep": 1}))
    cache.batch_repeat_interleave(input_ids.shape[0])
    out = net(
        input_ids=input_ids[:, batch.shared :],
        attention_mask=attention,
        position_ids=positions[:, batch.shared :],
        past_key_values=cache,
        use_cache=True,
        **keep,
    )
    return out.last_hidden_state[:, -batch.keep:] if hidden else out.logits
