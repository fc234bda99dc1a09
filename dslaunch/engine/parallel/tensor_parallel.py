"""Tensor (model) parallelism, Megatron's way: split the big matmuls across the ranks of the
``model`` group so each rank holds and computes a 1/tp slice.

- Region functions (autograd): ``copy_to_tp`` (forward identity, backward all-reduce),
  ``reduce_from_tp`` (forward all-reduce, backward identity), ``gather_from_tp`` (forward
  all-gather along the last dim, backward keep own slice), ``scatter_to_tp`` (the reverse).
- ``ColumnParallelLinear``: output features split (weight rows); input copied in, output left
  split (``gather_output=False``) or gathered. Consecutive column layers reading one tensor
  (q / k / v, gate / up) share its copy (``shared_copy_to_tp``): one backward all-reduce of
  their summed input gradient, not one each. ``RowParallelLinear``: input features split
  (weight columns); partial outputs all-reduced, then the (replicated) bias added.
  Column then Row (attention's qkv -> proj, the MLP's fc -> proj) costs one all-reduce forward
  and one backward per block half.
- ``VocabParallelEmbedding``: each rank owns a contiguous vocabulary range; the partial lookups
  are all-reduced. ``vocab_parallel_cross_entropy``: cross-entropy over vocabulary-split logits
  without gathering them (max, sum of exp and the target logit are all-reduced).
- ``RNGTracker`` / ``tp_manual_seed``: the default generator is seeded the same on every TP rank
  (dropout on replicated activations agrees), ``tracker.fork()`` switches to a per-TP-rank
  stream for dropout inside split regions (attention heads).
- Which layers of a model get which of these is the model's own plan, applied by
  ``tp_plan.apply_tp_plan(model, plan, group)`` (the example GPT's: examples/gpt_tp.py).

Replicated parameters (LayerNorms, row-parallel biases, position embeddings) get the full,
identical gradient on every TP rank through ``copy_to_tp``'s backward all-reduce: nothing else
is reduced over the model group. Split parameters are marked (``mark_split``: Megatron's
``tensor_model_parallel`` flag plus the rows this rank holds), so the global gradient norm counts
replicated ones once (``pipe/grad_norm.py``) and ``dslaunch ckpt to-fp32`` can put the slices back
(``checkpoint/consolidate.py``).
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class PlannedGroup:
    """A stand-in for a process group that cannot be made yet: a replacement rank of an
    in-process recovery builds its engine alone before it joins (``engine/recovery/grid.py``),
    and splitting its model (or placing its pipeline stage) needs only the group's size and this
    rank's place in it. Replaced by the real group once the rank has joined; a collective on it
    is an error."""

    def __init__(self, ranks: list, global_rank: int):
        self.ranks = list(ranks)
        self.rank = self.ranks.index(global_rank)


def group_world(group) -> int:
    if isinstance(group, PlannedGroup):
        return len(group.ranks)
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group) -> int:
    if isinstance(group, PlannedGroup):
        return group.rank
    return dist.get_rank(group) if dist.is_initialized() else 0


def _split_last(x: torch.Tensor, group) -> torch.Tensor:
    w = group_world(group)
    if x.shape[-1] % w:
        raise ValueError(f"tensor parallel: last dim {x.shape[-1]} is not divisible by {w}")
    return x.chunk(w, dim=-1)[group_rank(group)].contiguous()


_DRY: list = []  # non-empty inside ``dry_collectives``


@contextlib.contextmanager
def dry_collectives():
    """The forward collectives of the split layers made locally: a sum is this rank's own part,
    a gather leaves the other ranks' features zero. For the forwards of a step in-process
    recovery abandoned (``recovery/guard.guarded_forward``): a replacement makes the new
    TP group's first collectives, and such a forward's output only carries the script to the
    end of that step (its backward and step are skipped)."""
    _DRY.append(True)
    try:
        yield
    finally:
        _DRY.pop()


def _forward_all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> None:
    if not _DRY:
        dist.all_reduce(x, op=op, group=group)


def _gather_last(x: torch.Tensor, group) -> torch.Tensor:
    if _DRY:  # this rank's features in its place, the others' zero
        w, r = group_world(group), group_rank(group)
        return F.pad(x, (r * x.shape[-1], (w - 1 - r) * x.shape[-1]))
    # one flat all-gather (rank-major) and one copy into place; a list all-gather then cat
    # copies the gathered bytes twice more (gloo stages a list output in a flat buffer)
    w, x = group_world(group), x.contiguous()
    flat = x.new_empty((w * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(flat, x, group=group)
    return flat.view(w, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], w * x.shape[-1])


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _last_copy.pop(id(ctx.group), None)  # the forward that shared it is over
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, inplace):
        if inplace and x.is_contiguous():  # a fresh partial product nobody else reads
            ctx.mark_dirty(x)
        else:
            x = x.contiguous().clone()
        _forward_all_reduce(x, group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def _gather_last_uneven(x: torch.Tensor, group, sizes: list) -> torch.Tensor:
    """``_gather_last`` of slices of ``sizes[r]`` features per rank: each pads to the longest."""
    longest = max(sizes)
    padded = F.pad(x, (0, longest - x.shape[-1])) if x.shape[-1] < longest else x
    whole = _gather_last(padded, group)
    return torch.cat([whole[..., r * longest:r * longest + n] for r, n in enumerate(sizes)], -1)


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sizes):
        ctx.group, ctx.sizes = group, sizes
        return _gather_last(x, group) if sizes is None else _gather_last_uneven(x, group, sizes)

    @staticmethod
    def backward(ctx, grad):
        if ctx.sizes is None:
            return _split_last(grad, ctx.group), None, None
        r = group_rank(ctx.group)
        start = sum(ctx.sizes[:r])
        return grad[..., start:start + ctx.sizes[r]].contiguous(), None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


def copy_to_tp(x, group):
    return x if group_world(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x, group, inplace=False):
    """Sum ``x`` over the group (backward: identity). ``inplace``: all-reduce ``x`` itself, for
    a caller whose ``x`` is a fresh product read by nothing else (a row-parallel matmul's)."""
    return x if group_world(group) == 1 else _ReduceFromTP.apply(x, group, inplace)


# per group: the last input copied into the region (weakly), its version and the copy (a view
# of it); dropped by the copy's backward or replaced by the next input
_last_copy: dict = {}


def shared_copy_to_tp(x, group):
    """``copy_to_tp`` shared by consecutive column-parallel layers that read the same tensor
    (attention's q / k / v, the MLP's gate / up): they get one copy, whose backward all-reduces
    the sum of their input gradients once instead of once per layer. An input changed in place
    (its version moved) is copied anew. Between a forward and its backward the cache holds the
    last copy, a view of an input the graph keeps anyway."""
    if group_world(group) == 1 or not (torch.is_grad_enabled() and x.requires_grad):
        return x  # no input gradient to reduce
    key = id(group)
    hit = _last_copy.get(key)
    if hit is not None and hit[0]() is x and hit[1] == x._version:
        return hit[2]
    out = _CopyToTP.apply(x, group)
    _last_copy[key] = (weakref.ref(x), x._version, out)
    return out


def gather_from_tp(x, group, sizes=None):
    """All-gather the last dim; ``sizes``: every rank's share when they differ."""
    return x if group_world(group) == 1 else _GatherFromTP.apply(x, group, sizes)


def scatter_to_tp(x, group):
    return x if group_world(group) == 1 else _ScatterToTP.apply(x, group)


def _ranges(index) -> list:
    """An increasing index list as ``[[start, stop], ...]`` runs (JSON-friendly)."""
    out = []
    for i in (int(v) for v in index):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def mark_split(param, dim: int, full: int, ranges: list) -> None:
    """Record that ``param`` is this rank's slice of a full tensor: along ``dim`` (of size
    ``full`` in the whole tensor) it holds the rows ``ranges`` (``[[start, stop], ...]``, in
    order). The global grad norm counts every marked parameter on every TP rank (the others,
    replicated, once); checkpoint consolidation puts the slices back where ``ranges`` say."""
    param.tensor_model_parallel = True
    param.partition_dim, param.tp_full, param.tp_ranges = int(dim), int(full), ranges


def _block(n_per_rank: int, rank: int) -> list:
    return [[rank * n_per_rank, (rank + 1) * n_per_rank]]


def divide(n: int, w: int, what: str) -> int:
    if n % w:
        raise ValueError(f"tensor parallel: {what} ({n}) is not divisible by the tensor-parallel "
                         f"size {w}")
    return n // w


# -- layers ------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's rows (output features) split over the group."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None,
                 init_method=None, dtype=None, device=None):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = divide(out_features, group_world(group), "output features")
        self.gather_sizes = None  # even: every rank's share is out_per_rank
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype,
                                               device=device))
        self.bias = (nn.Parameter(torch.zeros(self.out_per_rank, dtype=dtype, device=device))
                     if bias else None)
        if init_method is not None:
            init_method(self.weight)
        else:
            nn.init.normal_(self.weight, std=0.02)
        self._mark(_block(self.out_per_rank, group_rank(group)))

    def _mark(self, ranges):
        if group_world(self.group) > 1:
            mark_split(self.weight, 0, self.out_features, ranges)
            if self.bias is not None:
                mark_split(self.bias, 0, self.out_features, ranges)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, gather_output=False, rows=None,
                    gather_sizes=None):
        """Slice a full ``nn.Linear``: this rank keeps the output features ``rows`` (an index
        tensor, as many on every rank or not: AutoTP's uneven splits); default the rank's
        contiguous block of an even split. With ``gather_output`` and uneven rows,
        ``gather_sizes`` lists every rank's count (contiguous blocks in rank order)."""
        w = group_world(group)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.group, layer.gather_output = group, gather_output
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        if rows is None:
            layer.out_per_rank = divide(linear.out_features, w, "output features")
            r = group_rank(group)
            rows = torch.arange(r * layer.out_per_rank, (r + 1) * layer.out_per_rank,
                                device="cpu")
        layer.out_per_rank = len(rows)
        layer.gather_sizes = list(gather_sizes) if gather_sizes is not None else None
        if gather_output and layer.gather_sizes is None \
                and layer.out_per_rank * w != linear.out_features:
            raise ValueError("tensor parallel: gather_output of an uneven split of the "
                             f"{linear.out_features} output features over {w} ranks needs "
                             "gather_sizes")
        with torch.no_grad():
            layer.weight = nn.Parameter(linear.weight[rows].clone())
            layer.bias = (nn.Parameter(linear.bias[rows].clone()) if linear.bias is not None
                          else None)
        layer._mark(_ranges(rows.cpu().tolist()))
        return layer

    def forward(self, x):
        y = F.linear(shared_copy_to_tp(x, self.group), self.weight, self.bias)
        if not self.gather_output:
            return y
        return gather_from_tp(y, self.group, getattr(self, "gather_sizes", None))  # (older pickles)

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features} ({self.out_per_rank} per rank), "
                f"gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's columns (input features) split over the group; the partial
    products are all-reduced and the full bias is added once."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, group=None,
                 init_method=None, dtype=None, device=None):
        super().__init__()
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = divide(in_features, group_world(group), "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype,
                                               device=device))
        self.bias = (nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
                     if bias else None)
        if init_method is not None:
            init_method(self.weight)
        else:
            nn.init.normal_(self.weight, std=0.02)
        self._mark()

    def _mark(self, ranges=None):
        # the bias is replicated (added once after the all-reduce): not marked
        if group_world(self.group) > 1:
            mark_split(self.weight, 1, self.in_features,
                       ranges or _block(self.in_per_rank, group_rank(self.group)))

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, input_is_parallel=True, cols=None):
        """Slice a full ``nn.Linear``: this rank keeps the input features ``cols`` (a range
        ``[start, stop)``, as long on every rank or not: AutoTP's uneven head splits); default
        the rank's block of an even split."""
        w, r = group_world(group), group_rank(group)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.group, layer.input_is_parallel = group, input_is_parallel
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        if cols is None:
            per = divide(linear.in_features, w, "input features")
            cols = (r * per, (r + 1) * per)
        elif not input_is_parallel:
            raise ValueError("tensor parallel: an uneven row split needs input_is_parallel")
        layer.in_per_rank = cols[1] - cols[0]
        with torch.no_grad():
            layer.weight = nn.Parameter(linear.weight[:, cols[0]:cols[1]].clone())
            layer.bias = nn.Parameter(linear.bias.clone()) if linear.bias is not None else None
        layer._mark([list(cols)])
        return layer

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.group)
        y = reduce_from_tp(F.linear(x, self.weight), self.group, inplace=True)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return f"in={self.in_features} ({self.in_per_rank} per rank), out={self.out_features}"


class VocabParallelEmbedding(nn.Module):
    """An embedding whose rows (the vocabulary) are split in contiguous ranges over the group."""

    def __init__(self, num_embeddings, embedding_dim, group=None, init_method=None, dtype=None,
                 device=None):
        super().__init__()
        self.group = group
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        per = divide(num_embeddings, group_world(group), "vocabulary size")
        self.vocab_start, self.vocab_end = group_rank(group) * per, (group_rank(group) + 1) * per
        self.weight = nn.Parameter(torch.empty(per, embedding_dim, dtype=dtype, device=device))
        (init_method or (lambda t: nn.init.normal_(t, std=0.02)))(self.weight)
        self._mark()

    def _mark(self):
        if group_world(self.group) > 1:
            mark_split(self.weight, 0, self.num_embeddings, [[self.vocab_start, self.vocab_end]])

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, group):
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.group = group
        layer.num_embeddings, layer.embedding_dim = emb.num_embeddings, emb.embedding_dim
        per = divide(emb.num_embeddings, group_world(group), "vocabulary size")
        layer.vocab_start, layer.vocab_end = group_rank(group) * per, (group_rank(group) + 1) * per
        with torch.no_grad():
            layer.weight = nn.Parameter(emb.weight[layer.vocab_start:layer.vocab_end].clone())
        layer._mark()
        return layer

    def forward(self, tokens):
        if group_world(self.group) == 1:
            return F.embedding(tokens, self.weight)
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_end)
        local = (tokens - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        _forward_all_reduce(local_max, group, dist.ReduceOp.MAX)
        shifted = logits - local_max.unsqueeze(-1)
        n_local = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + n_local)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _forward_all_reduce(picked, group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        _forward_all_reduce(sum_exp, group)
        loss = sum_exp.log() - picked
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local_target, outside = ctx.saved_tensors
        g = softmax.clone()
        hit = (~outside).to(g.dtype)
        g.scatter_add_(-1, local_target.unsqueeze(-1), -hit.unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group=None,
                                 vocab_start: int | None = None) -> torch.Tensor:
    """Per-position cross-entropy (shape of ``target``) of logits split over the vocabulary:
    ``logits[..., V/tp]`` holds this rank's range (``vocab_start`` defaults to rank * V/tp)."""
    if vocab_start is None:
        vocab_start = group_rank(group) * logits.shape[-1]
    if group_world(group) == 1:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                               reduction="none").view_as(target)
    return _VocabParallelCrossEntropy.apply(logits, target, group, vocab_start)


# -- RNG ---------------------------------------------------------------------------------------

class RNGTracker:
    """Named generator states to fork into: dropout inside split regions uses the per-TP-rank
    stream, everything else the default generator (same seed on every TP rank)."""

    def __init__(self):
        self.states: dict = {}

    def add(self, name: str, seed: int) -> None:
        gen = torch.Generator().manual_seed(int(seed))
        self.states[name] = gen.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "tensor-parallel"):
        if name not in self.states:
            raise RuntimeError(f"RNG tracker: no state {name!r}; call tp_manual_seed(seed, "
                               "group) first")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


_TRACKER = RNGTracker()
TP_SEED_OFFSET = 2718  # Megatron's offset of the tensor-parallel stream


def get_rng_tracker() -> RNGTracker:
    return _TRACKER


def tp_manual_seed(seed: int, group=None) -> None:
    """Seed the default generator with ``seed`` (identical on TP peers) and the tracker's
    ``tensor-parallel`` stream with ``seed + 2718 + tp_rank`` (different per TP rank)."""
    torch.manual_seed(seed)
    _TRACKER.add("tensor-parallel", seed + TP_SEED_OFFSET + group_rank(group))

