"""``TiledLinear`` (DeepSpeed's ``deepspeed.zero.TiledLinear``): one ``nn.Linear`` cut into a grid
of smaller ones, so that ZeRO-3, which gathers a module's parameters as one unit, holds one tile
whole at a time instead of the whole huge weight.

The weight ``[out_features, in_features]`` is cut into ``out_splits`` row blocks and ``in_splits``
column blocks (sizes as even as they go, the larger blocks first); tile ``linears[o][i]`` maps
input columns block ``i`` to output block ``o``. Output block ``o`` is the sum over ``i`` of the
tiles' outputs, the bias (one per output block) carried by the last input tile; the output blocks
are concatenated. Numerically it is ``nn.Linear`` with the same weight, up to the order of the
sums.
"""

from __future__ import annotations

import torch

from dslaunch.engine.zero.zero_init import GatheredParameters


def _bounds(n: int, parts: int) -> list:
    """``parts + 1`` cut points of ``range(n)`` in near-equal blocks, the larger ones first."""
    size, extra = divmod(n, parts)
    cuts = [0]
    for i in range(parts):
        cuts.append(cuts[-1] + size + (1 if i < extra else 0))
    return cuts


class TiledLinear(torch.nn.Module):
    """A drop-in for ``torch.nn.Linear(in_features, out_features, bias)`` made of
    ``out_splits x in_splits`` tiles of ``linear_cls`` (extra ``kwargs`` go to it).

    ``input_is_already_split``: ``forward`` takes the ``in_splits`` input blocks as a list;
    ``combine_out_splits=False``: it returns the ``out_splits`` output blocks as a list;
    ``init_linear``: copy the weights of this ``nn.Linear`` into the tiles."""

    def __init__(self, in_features, out_features, bias=True, in_splits=1, out_splits=1,
                 input_is_already_split=False, combine_out_splits=True,
                 linear_cls=torch.nn.Linear, init_linear=None, **kwargs):
        super().__init__()
        if not 1 <= in_splits <= in_features:
            raise RuntimeError(f"TiledLinear: in_splits={in_splits} must be in [1, in_features="
                               f"{in_features}]")
        if not 1 <= out_splits <= out_features:
            raise RuntimeError(f"TiledLinear: out_splits={out_splits} must be in [1, "
                               f"out_features={out_features}]")
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split = input_is_already_split
        self.combine_out_splits = combine_out_splits
        self.in_parts = _bounds(in_features, in_splits)
        self.out_parts = _bounds(out_features, out_splits)
        self.linears = torch.nn.ModuleList()
        for o in range(out_splits):
            rows = self.out_parts[o + 1] - self.out_parts[o]
            self.linears.append(torch.nn.ModuleList(
                linear_cls(self.in_parts[i + 1] - self.in_parts[i], rows,
                           bias=bias and i == in_splits - 1, **kwargs)
                for i in range(in_splits)))
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_):
        if self.in_splits == 1:
            inputs = [input_]
        elif self.input_is_already_split:
            inputs = list(input_)
            if len(inputs) != self.in_splits:
                raise ValueError(f"TiledLinear: {len(inputs)} input blocks given, in_splits is "
                                 f"{self.in_splits}")
        else:
            sizes = [b - a for a, b in zip(self.in_parts, self.in_parts[1:])]
            inputs = torch.split(input_, sizes, dim=-1)
        outputs = []
        for row in self.linears:
            out = None
            for tile, x in zip(row, inputs):
                y = tile(x)
                out = y if out is None else out + y
            outputs.append(out)
        return torch.cat(outputs, dim=-1) if self.combine_out_splits else outputs

    @torch.no_grad()
    def copy_params_from(self, other) -> None:
        """Copy ``other``'s weight (and bias) into the tiles. Under ZeRO-3 a collective: every
        rank calls it, rank 0's values win (``GatheredParameters(modifier_rank=0)``)."""
        if tuple(other.weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"TiledLinear.copy_params_from: weight shape "
                             f"{tuple(other.weight.shape)}, expected "
                             f"({self.out_features}, {self.in_features})")
        if self.use_bias != (getattr(other, "bias", None) is not None):
            raise ValueError("TiledLinear.copy_params_from: one has a bias, the other not")
        for o, row in enumerate(self.linears):
            r0, r1 = self.out_parts[o], self.out_parts[o + 1]
            for i, tile in enumerate(row):
                c0, c1 = self.in_parts[i], self.in_parts[i + 1]
                params = [tile.weight] + ([tile.bias] if tile.bias is not None else [])
                with GatheredParameters(params, modifier_rank=0):
                    tile.weight.copy_(other.weight[r0:r1, c0:c1])
                    if tile.bias is not None:
                        tile.bias.copy_(other.bias[r0:r1])
