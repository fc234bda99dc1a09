"""The global gradient norm of a pipeline / tensor-parallel job, for gradient clipping and for
the non-finite check (which skips the step in every precision: engine/base/step_policy.py).

A ZeRO strategy computes the norm over its data-parallel group only: with pipeline stages or TP
ranks that is one stage's / one slice's norm, and a NaN / inf seen on one stage would skip the
step there and not elsewhere; so the pipe engine installs this whenever the model is split.
``install(strategy, ...)`` wraps the strategy's ``step`` so that at each boundary:

1. every rank adds up ``||g||^2`` of the gradient elements it is the one to count, and one
   all-reduce over the whole world (fp64: sum and an overflow flag) gives the model's norm;
   an element is counted once: TP-replicated parameters (anything not marked
   ``tensor_model_parallel``, e.g. LayerNorms, row-parallel biases) on TP rank 0 only, a tied
   weight on its first owner stage only, and with stage 0 (every data rank holds the same
   reduced gradients) on data rank 0 only; with ZeRO 1-2 each data rank counts its own shard;
2. on an overflow anywhere every rank skips the step and lowers the loss scale;
3. otherwise the gradients are multiplied by the clip coefficient (torch's
   ``max_norm / (norm + 1e-6)`` rule, at most 1) and the strategy steps with clipping off.
Steps 2-3 are ``engine/base/step_policy.py``'s decision (``MODEL_PARALLEL``), as for every strategy.

The strategy's gradient tensors are read where the ZeRO seam leaves them after the boundary
reduction: stage 0's ``views`` (fp32, reduced), stages 1-2's ``_grad_chunks()`` (this rank's
reduced shard, located per parameter by ``layout.shard_pieces``).
"""

from __future__ import annotations

import math

import torch.distributed as dist

from dslaunch.engine.base.step_policy import MODEL_PARALLEL, GradNorm, all_reduce_sq_norm, loss_scale_of, sum_of_squares


def counted_params(model, tp_rank: int, tp_world: int, tied_duplicates: set) -> set:
    """ids of the parameters whose gradients this rank counts (before the data-parallel rule)."""
    out = set()
    for p in model.parameters():
        if id(p) in tied_duplicates:
            continue
        if tp_world > 1 and tp_rank != 0 and not getattr(p, "tensor_model_parallel", False):
            continue
        out.add(id(p))
    return out


def tied_duplicate_params(model) -> set:
    """ids of tied weights held here whose first owner is another stage."""
    groups = getattr(model, "tied_groups", None) or {}
    rank = model.grid.global_rank if groups else None  # (a replacement built alone: not dist's)
    out = set()
    for key, (_, ranks) in groups.items():
        if ranks[0] != rank:
            out.update(id(p) for p in model._tied_params(key))
    return out


class ModelParallelNorm:
    def __init__(self, strategy, counted: set, dp_rank: int):
        self.strategy, self.counted, self.dp_rank = strategy, counted, dp_rank
        self._inner_step = strategy.step
        self.norm = None
        if hasattr(strategy, "views") and hasattr(strategy, "flat"):
            self._local_sq = self._stage0_sq
            self._scale = lambda coef: strategy.flat.mul_(coef)
        elif hasattr(strategy, "_grad_chunks") and hasattr(strategy, "groups"):
            self._local_sq = self._stage12_sq
            self._scale = self._stage12_scale
        else:
            raise ValueError("gradient_clipping / fp16 with pipeline or tensor parallelism: "
                             f"supported with ZeRO stage 0 or 1, not {type(strategy).__name__}")

    def _stage0_sq(self) -> float:
        if self.dp_rank != 0:  # every data rank holds the same reduced gradients
            return 0.0
        return sum_of_squares(view for p, view in self.strategy.views.items()
                              if id(p) in self.counted)

    def _stage12_sq(self) -> float:
        s = self.strategy
        self._chunks = s._grad_chunks()
        return sum_of_squares(self._counted_shard_pieces(s, self._chunks))

    def _counted_shard_pieces(self, s, group_chunks):
        """The pieces of this rank's gradient shard that belong to counted parameters."""
        for g, chunks in zip(s.groups, group_chunks):
            starts, pos = [], 0
            for c in chunks:
                starts.append(pos)
                pos += c.numel()
            for bi, slot, lo, hi, spos in g.layout.shard_pieces(s.rank):
                if id(g.params[slot.name]) in self.counted:
                    off = spos - starts[bi]
                    yield chunks[bi][off: off + hi - lo]

    def _stage12_scale(self, coef: float) -> None:
        for chunks in self._chunks:
            for c in chunks:
                c.mul_(coef)

    def _world_norm(self, loss_scaler) -> GradNorm:
        """One fp64 all-reduce over the whole world: every pipe stage, TP rank and data rank."""
        scale = loss_scale_of(loss_scaler)
        sq, overflow = all_reduce_sq_norm(self._local_sq() / (scale * scale), dist.all_reduce)
        return GradNorm(math.sqrt(sq), overflow)

    def step(self, clip_norm: float, loss_scaler) -> bool:
        decision = MODEL_PARALLEL.decide(self._world_norm(loss_scaler), clip_norm, loss_scaler)
        self.norm = decision.grad_norm
        if decision.skip:
            return False
        if decision.coef != 1.0:  # the clip factor alone: the strategy's step unscales
            self._scale(decision.coef)
        return self._inner_step(0.0, loss_scaler)

    def grad_norm(self):
        return self.norm


def install(strategy, model, tp_rank: int, tp_world: int, dp_rank: int) -> ModelParallelNorm:
    """Route ``strategy.step`` / ``strategy.grad_norm`` through the model-parallel norm (instance
    attributes: the strategy object stays what it is for checkpoints and everything else)."""
    counted = counted_params(model, tp_rank, tp_world, tied_duplicate_params(model))
    mp = ModelParallelNorm(strategy, counted, dp_rank)
    strategy.step, strategy.grad_norm = mp.step, mp.grad_norm
    return mp
