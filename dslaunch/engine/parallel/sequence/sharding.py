"""The sequence axis outside attention: each sample's sequence sharded over the sequence-parallel
ranks (labels shifted before sharding, so the token at a shard's last position still predicts the
first token of the next shard), and the loss averaged over every shard's valid tokens.

Gradient convention (the engine's, ``pipe/engine.py`` ``tensor_parallel_engine``): the weights'
gradients are averaged over the sequence x data ranks. A rank whose loss is the mean over its own
shard is exact when every shard has the same number of valid tokens (the usual fixed-length
case); with ignored or padded tokens use ``sequence_parallel_loss``, which weights each shard by
its valid tokens and gives every rank the loss of the whole sequence.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE_INDEX = -100


def shard_sequence(tensor: torch.Tensor, sp_rank: int, sp_world_size: int,
                   dim: int = 1) -> torch.Tensor:
    """This rank's contiguous block of ``tensor`` along ``dim`` (the sequence)."""
    n = tensor.shape[dim]
    if n % sp_world_size:
        raise ValueError(f"sequence parallel: a sequence of {n} tokens does not split over "
                         f"{sp_world_size} ranks; pad it to a multiple of {sp_world_size}")
    chunk = n // sp_world_size
    return tensor.narrow(dim, sp_rank * chunk, chunk).contiguous()


def shift_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``labels[:, 1:]`` with ``ignore_index`` appended: position ``t`` predicts token ``t + 1``
    (what a causal LM's loss shifts inside; with the sequence sharded it must happen first)."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) whose backward is the all-reduce of the gradients: every rank's output
    depends on every rank's input."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def sequence_parallel_loss(loss_sum: torch.Tensor, num_valid, group) -> torch.Tensor:
    """The mean loss of the whole sequence, on every rank of ``group``, from each rank's sum of
    per-token losses over its shard and its number of valid tokens. Its gradients, averaged over
    the sequence x data ranks by the engine, are the gradients of the whole sequence's mean."""
    count = torch.as_tensor(num_valid, dtype=torch.float64, device=loss_sum.device).reshape(())
    dist.all_reduce(count, group=group)
    # sum over the group scales each rank's gradient by the group size, which the engine's
    # average over the group divides out
    total = _SumOverGroup.apply(_at_least_fp32(loss_sum), group)
    return total / count.clamp(min=1).to(total.dtype)


def sequence_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group,
                                    ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Cross-entropy over a sequence-sharded batch (``labels`` already shifted and sharded):
    the mean over every valid token of every shard, ``ignore_index`` excluded."""
    flat = labels.reshape(-1)
    loss_sum = F.cross_entropy(_at_least_fp32(logits).reshape(-1, logits.size(-1)), flat,
                               ignore_index=ignore_index, reduction="sum")
    return sequence_parallel_loss(loss_sum, (flat != ignore_index).sum(), group)


class UlyssesSPDataLoaderAdapter:
    """DeepSpeed's adapter: ``UlyssesSPDataLoaderAdapter(dl, sp_rank=, sp_group=,
    sp_world_size=, device=)`` wraps any data loader whose batches are dicts of ``[batch, seq,
    ...]`` tensors with ``input_ids``, ``position_ids`` and ``labels``.

    The ranks of a sequence group each draw one batch, exchange them, and then work through the
    ``sp_world_size`` batches one at a time, every rank taking its shard of the sequence: the
    group computes one sample set together (``len()`` is ``sp_world_size`` times the loader's).
    ``labels`` is replaced by ``shift_labels`` (shifted, then sharded); non-tensor entries are
    copied to every rank; shards are kept on the CPU and moved by the caller."""

    def __init__(self, dl, sp_rank: int, sp_group, sp_world_size: int, device):
        self.dl = dl
        self.sp_rank, self.sp_group, self.sp_world_size = sp_rank, sp_group, sp_world_size
        self.device = device
        self.iter = iter(dl)
        self.micro_batches: deque = deque()

    def __len__(self):
        return len(self.dl) * self.sp_world_size

    def __iter__(self):
        return self

    def __next__(self):
        if not self.micro_batches:
            self.refill()
        return self.micro_batches.popleft()

    def refill(self) -> None:
        try:
            batch = next(self.iter)
        except StopIteration:  # the next epoch starts over
            self.iter = iter(self.dl)
            raise
        if "position_ids" not in batch:
            raise ValueError("UlyssesSPDataLoaderAdapter: every batch needs `position_ids` (each "
                             "token keeps its global position after sharding; "
                             "torch.arange(seq_len) per sample when sequences are not packed)")
        gathered = [dict() for _ in range(self.sp_world_size)]
        seqlen = batch["input_ids"].shape[1]
        lengths = _all_gather_ints(seqlen, self.sp_group, self.sp_world_size, self.device)
        for key, value in batch.items():
            if torch.is_tensor(value):
                if value.shape[1] != seqlen:
                    raise ValueError(f"UlyssesSPDataLoaderAdapter: {key}'s shape "
                                     f"{tuple(value.shape)} does not match input_ids' "
                                     f"{tuple(batch['input_ids'].shape)}")
                value = value.to(self.device)
                parts = [value.new_zeros((value.shape[0], n) + tuple(value.shape[2:]))
                         for n in lengths]
                dist.all_gather(parts, value, group=self.sp_group)
            else:
                parts = [None] * self.sp_world_size
                dist.all_gather_object(parts, value, group=self.sp_group)
            for r, part in enumerate(parts):
                gathered[r][key] = part
        for sample in gathered:
            if "labels" in sample:
                sample["shift_labels"] = shift_labels(sample.pop("labels"))
            self.micro_batches.append({
                k: shard_sequence(v, self.sp_rank, self.sp_world_size).cpu()
                if torch.is_tensor(v) else v for k, v in sample.items()})


def _all_gather_ints(value: int, group, world: int, device) -> list:
    mine = torch.tensor([value], dtype=torch.int64, device=device)
    every = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [int(x.item()) for x in every]
