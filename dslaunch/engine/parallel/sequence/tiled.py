"""Tiled compute for long sequences (DeepSpeed's ALST recipe): an MLP and a logits + loss run a
few rows of the sequence at a time, so their big intermediates (the MLP's ``[seq, 4*hidden]``, the
``[seq, vocab]`` logits) exist for one tile only, never for the whole sequence.

``TiledMLP.apply(fn, self, x, shards, compute_params)`` and
``TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params, output_reduction)``
take DeepSpeed 0.19's arguments (``deepspeed.runtime.sequence_parallel.ulysses_sp``); ``fn`` is
called as ``fn(self, x_tile)`` / ``fn(self, x_tile, y_tile[, mask_tile])``.

How the gradients flow: the weights ``fn`` reads (``compute_params``, plus the parameters of
``self`` when it is a module) are inputs of the autograd node, so their gradients are summed over
the tiles inside it and handed to autograd once, scaled by the gradient that reaches the node:
exact for any loss scale or accumulation divisor (DeepSpeed accumulates the weight gradients of
the logits loss into ``.grad`` during the forward and scales only the input's), and gradient
hooks (ZeRO's reduce) fire once per weight and step as without tiling. ``fn`` must read no
trainable weight outside those two.

- TiledMLP: the forward runs each tile under no_grad and keeps only ``x``; the backward runs
  each tile again with grad and backpropagates it (the forward runs twice, as DeepSpeed's).
- TiledFusedLogitsLoss: meant to be the last node of the graph, it backpropagates each tile
  during the forward (no second forward) and keeps the input's and weights' gradients for the
  backward. ``output_reduction``: "mean" averages the tiles' outputs (the true mean only when
  every tile has as many counted elements), "sum" adds them (divide by the count outside, or
  inside ``fn``, for an exact mean with uneven tiles or masks).
"""

from __future__ import annotations

import torch


def _weights(self, compute_params) -> list:
    """The trainable tensors ``fn`` may read, each once: ``compute_params`` and the parameters
    of ``self`` (when it is a module)."""
    found, seen = [], set()
    own = self.parameters() if isinstance(self, torch.nn.Module) else ()
    for p in [*(compute_params or ()), *own]:
        if torch.is_tensor(p) and p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            found.append(p)
    return found


def _add(total, grads):
    return [g if t is None else (t if g is None else t + g) for t, g in zip(total, grads)]


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, self, x, shards, *weights):
        ctx.fn, ctx.self, ctx.shards, ctx.weights = fn, self, shards, weights
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(self, tile) for tile in torch.chunk(x, shards, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x_needs = ctx.needs_input_grad[2]
        wanted = [w for w, need in zip(ctx.weights, ctx.needs_input_grad[4:]) if need]
        x_grad = torch.zeros_like(x) if x_needs else None
        w_grads = [None] * len(wanted)
        start = 0
        for tile, grad_tile in zip(torch.chunk(x.detach(), ctx.shards, dim=-2),
                                   torch.chunk(grad, ctx.shards, dim=-2)):
            tile = tile.requires_grad_(x_needs)
            with torch.enable_grad():
                out = ctx.fn(ctx.self, tile)
            inputs = ([tile] if x_needs else []) + wanted
            got = torch.autograd.grad(out, inputs, grad_tile, allow_unused=True)
            if x_needs:
                x_grad.narrow(-2, start, tile.shape[-2]).copy_(got[0])
                got = got[1:]
            w_grads = _add(w_grads, got)
            start += tile.shape[-2]
        w_grads = iter(w_grads)
        return (None, None, x_grad, None,
                *[next(w_grads) if need else None for need in ctx.needs_input_grad[4:]])


class TiledMLP:
    """``TiledMLP.apply(fn, self, x, shards, compute_params)``: ``fn(self, x)`` computed ``shards``
    tiles of the sequence dimension (-2) at a time; ``x`` is ``[batch, seq, hidden]`` or
    ``[seq, hidden]``. Exact gradients; the tile's intermediates are rebuilt in backward."""

    @staticmethod
    def apply(fn, self, x, shards, compute_params=None):
        return _TiledMLP.apply(fn, self, x, int(shards), *_weights(self, compute_params))


class _TiledLogitsLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, self, x, y, mask, shards, output_reduction, grad_mode, *weights):
        batch_seq = x.shape[:2]
        x, y = x.reshape(-1, *x.shape[2:]), y.reshape(-1, *y.shape[2:])
        masks = torch.chunk(mask.reshape(-1), shards) if mask is not None else None
        # under no_grad (evaluation) the node is not recorded: no gradient work at all
        needs = ctx.needs_input_grad if grad_mode else (False,) * len(ctx.needs_input_grad)
        x_needs = needs[2]
        wanted = [w for w, need in zip(weights, needs[8:]) if need]
        backprop = x_needs or bool(wanted)
        # the gradient each tile's output gets from the reduction over tiles
        seed = torch.tensor(1.0 / shards if output_reduction == "mean" else 1.0, dtype=x.dtype,
                            device=x.device)
        x_grad = torch.zeros_like(x) if x_needs else None
        w_grads = [None] * len(wanted)
        outputs, start = [], 0
        for i, (tile, y_tile) in enumerate(zip(torch.chunk(x.detach(), shards),
                                               torch.chunk(y, shards))):
            tile = tile.requires_grad_(x_needs)
            args = (self, tile, y_tile) + ((masks[i],) if masks is not None else ())
            with torch.enable_grad() if backprop else torch.no_grad():
                out = fn(*args)
            if backprop:
                inputs = ([tile] if x_needs else []) + wanted
                got = torch.autograd.grad(out, inputs, seed.to(out.dtype), allow_unused=True)
                if x_needs:
                    x_grad.narrow(0, start, tile.shape[0]).copy_(got[0])
                    got = got[1:]
                w_grads = _add(w_grads, got)
            outputs.append(out.detach())
            start += tile.shape[0]
        stacked = torch.stack(outputs)
        loss = stacked.mean() if output_reduction == "mean" else stacked.sum()
        ctx.x_shape = (*batch_seq, *x.shape[1:])
        ctx.has_x_grad = x_grad is not None
        # per weight input: whether a gradient is kept for it (a weight fn did not read has none)
        got = iter(w_grads)
        ctx.w_slots = [need and next(got) is not None for need in needs[8:]]
        ctx.save_for_backward(*([x_grad] if x_grad is not None else []),
                              *[g for g in w_grads if g is not None])
        return loss

    @staticmethod
    def backward(ctx, grad):
        saved = list(ctx.saved_tensors)
        x_grad = saved.pop(0).view(ctx.x_shape) if ctx.has_x_grad else None
        one = bool(grad == 1)  # the usual case: the loss is the root; no product, exact

        def scaled(g):
            return g if one else g * grad.to(g.dtype)

        w_grads = iter(saved)
        return (None, None, scaled(x_grad) if x_grad is not None else None, None, None, None,
                None, None, *[scaled(next(w_grads)) if need else None for need in ctx.w_slots])


class TiledFusedLogitsLoss:
    """``TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params,
    output_reduction)``: ``fn(self, x_tile, y_tile[, mask_tile])`` (a scalar loss of the tile,
    typically ``lm_head`` then cross-entropy) over ``shards`` tiles of the flattened
    ``[batch * seq]`` rows, reduced by ``output_reduction`` ("mean" or "sum"); the full
    ``[batch, seq, vocab]`` logits never exist. ``x``: ``[batch, seq, ...]``; ``y``:
    ``[batch, seq, ...]``; ``mask``: None or ``[batch, seq]`` (given to ``fn`` when not None)."""

    @staticmethod
    def apply(fn, self, x, y, mask, shards, compute_params=None, output_reduction="mean"):
        if output_reduction not in ("mean", "sum"):
            raise ValueError(f"unknown reduction {output_reduction}: valid values are: "
                             '"mean"/"sum"')
        if x.dim() < 2 or y.dim() < 2:
            raise ValueError("x and y must be at least 2D [batch_size, seq_len, ...]")
        if x.shape[:2] != y.shape[:2]:
            raise ValueError("x and y batch/seq dims must match")
        if mask is not None and (mask.dim() != 2 or mask.shape != x.shape[:2]):
            raise ValueError(f"mask must be [batch_size, seq_len] = {list(x.shape[:2])}, got "
                             f"{list(mask.shape)}")
        return _TiledLogitsLoss.apply(fn, self, x, y, mask, int(shards), output_reduction,
                                      torch.is_grad_enabled(), *_weights(self, compute_params))
