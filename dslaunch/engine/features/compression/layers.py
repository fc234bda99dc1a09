"""``LinearLayer_Compress``: an ``nn.Linear`` that applies the compression methods its group
enabled (DeepSpeed 0.18's layer, learned from its semantics). ``init_compression`` swaps each
chosen ``nn.Linear`` for one, keeping the weight and bias tensors.

What forward applies, in this order, once the scheduler switched the method on:
- weight quantization (``quantize_weight_in_forward``): the weight quantized to the scheduled bits
  (``weight.start_bits``, which steps down to ``target_bits``), straight-through gradient; without
  ``quantize_weight_in_forward`` the scheduler quantizes ``weight.data`` after each step instead;
- sparse pruning: elementwise mask (``l1``: the largest ``dense_ratio`` of ``|w|``, fixed when
  enabled; ``topk``: learned scores ``sparse_mask_scores``);
- row pruning: output rows (and bias) masked (``l1``: rows' L1 norms; ``topk``: ``row_mask_scores``);
- activation quantization: the input quantized to 4 or 8 bits, per token over its range
  (``dynamic``) or over a running range (``static``, ``QuantAct``);
- head pruning (an attention output projection): input columns grouped by ``num_heads`` heads
  masked (``topk``: ``head_pruning_scores`` as DeepSpeed; ``l1``, dslaunch's: each head's column
  block's L1 norm).

``fix_*`` make a method permanent (``redundancy_clean``): masked values written into the weight,
and with ``dim_reduction`` the pruned rows / heads removed; the returned mask shrinks the related
modules (their input columns for rows, their output rows for heads).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dslaunch.engine.features.compression.quantize import quantize, quantize_range, topk_mask


class QuantAct(nn.Module):
    """Static activation quantization's range: a running min / max (momentum
    ``act_range_momentum``) updated in training, started from the first batch's."""

    def __init__(self, act_range_momentum=0.95, quant_mode="symmetric"):
        super().__init__()
        self.act_range_momentum = act_range_momentum
        self.quant_mode = quant_mode
        self.register_buffer("x_min_max", torch.zeros(2))

    def forward(self, x, num_bits, *args):
        if self.training:
            low, high = x.detach().min(), x.detach().max()
            if self.x_min_max[0] == self.x_min_max[1]:
                self.x_min_max[0], self.x_min_max[1] = low, high
            m = self.act_range_momentum
            self.x_min_max[0] = self.x_min_max[0] * m + low * (1 - m)
            self.x_min_max[1] = self.x_min_max[1] * m + high * (1 - m)
        return quantize_range(x, num_bits, self.x_min_max[0], self.x_min_max[1], self.quant_mode)


def _scores(shape, device) -> nn.Parameter:
    scores = nn.Parameter(torch.empty(shape, device=device))
    nn.init.kaiming_uniform_(scores, a=math.sqrt(5))
    return scores


class LinearLayer_Compress(nn.Linear):
    """An ``nn.Linear`` with compression; attributes and method names as DeepSpeed's."""

    def __init__(self, *args, bias=True, **kwargs):
        super().__init__(*args, bias=bias, **kwargs)
        self.sparse_pruning_method = None
        self.row_pruning_method = None
        self.head_pruning_method = None
        self.activation_quantization_method = None
        self._set_bits(None, None, None)
        self.weight_quantization_enabled_in_forward = False
        self.weight_quantization_enabled = False
        self.sparse_pruning_enabled = False
        self.row_pruning_enabled = False
        self.head_pruning_enabled = False
        self.activation_quantization_enabled = False
        self.weight_quantize_num_groups = 1
        self.weight_quantization_type = "symmetric"
        self.weight_quantization_stochastic = False

    @classmethod
    def from_linear(cls, old: nn.Linear) -> "LinearLayer_Compress":
        new = cls(old.in_features, old.out_features, bias=old.bias is not None,
                  device=old.weight.device, dtype=old.weight.dtype)
        new.weight = old.weight  # the same tensors: an optimizer built before still sees them
        new.bias = old.bias
        new._set_bits(None, None, None)
        new.train(old.training)
        return new

    def _set_bits(self, start, target, period) -> None:
        self.weight.start_bits = start
        self.weight.target_bits = target
        self.weight.q_period = period

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, sparse pruning={self.sparse_pruning_method}, "
                f"row pruning={self.row_pruning_method}, head pruning={self.head_pruning_method}, "
                f"weight_quantization={self.weight.target_bits}")

    # -- enabling ---------------------------------------------------------------------------------
    def enable_weight_quantization(self, start_bits, target_bits, quantization_period,
                                   weight_quantization_enabled_in_forward, quantization_type,
                                   num_groups, rounding="nearest"):
        self._set_bits(start_bits, target_bits, quantization_period)
        self.weight_quantization_enabled_in_forward = weight_quantization_enabled_in_forward
        self.weight_quantization_type = quantization_type
        self.weight_quantize_num_groups = num_groups
        self.weight_quantization_stochastic = rounding == "stochastic"
        if self.weight.numel() % num_groups:
            raise ValueError(f"quantize_groups {num_groups} does not divide the weight's "
                             f"{self.weight.numel()} values")

    def enable_sparse_pruning(self, ratio, method):
        self.sparse_pruning_ratio = ratio
        self.sparse_pruning_method = method
        if method == "l1":
            self.register_buffer("sparse_pruning_mask",
                                 topk_mask(self.weight.detach().abs(), ratio).detach())
        elif method == "topk":
            self.sparse_mask_scores = _scores(self.weight.shape, self.weight.device)
        else:
            raise NotImplementedError(f"sparse pruning method {method!r}")

    def enable_row_pruning(self, ratio, method):
        self.row_pruning_ratio = ratio
        self.row_pruning_method = method
        if method == "l1":
            norms = self.weight.detach().abs().sum(dim=1)
            self.register_buffer("row_pruning_mask", topk_mask(norms, ratio).detach().view(-1, 1))
        elif method == "topk":
            self.row_mask_scores = _scores((self.out_features, 1), self.weight.device)
        else:
            raise NotImplementedError(f"row pruning method {method!r}")

    def enable_head_pruning(self, ratio, method, num_heads):
        if self.in_features % num_heads:
            raise ValueError(f"head_pruning.num_heads {num_heads} does not divide "
                             f"in_features {self.in_features}")
        self.num_heads = num_heads
        self.head_pruning_ratio = ratio
        self.head_pruning_method = method
        if method == "topk":
            self.head_pruning_scores = _scores((1, num_heads), self.weight.device)
        elif method == "l1":  # dslaunch's: each head's block of input columns, by L1 norm
            norms = self.weight.detach().abs().t().reshape(num_heads, -1).sum(dim=1)
            self.register_buffer("head_pruning_mask", topk_mask(norms, ratio).detach().view(1, -1))
        else:
            raise NotImplementedError(f"head pruning method {method!r}")

    def enable_activation_quantization(self, bits, quantization_type, range_calibration):
        if bits not in (4, 8):
            raise ValueError("activation quantization takes 4 or 8 bits")
        self.activation_quantization_bits = bits
        self.activation_quantization_type = quantization_type
        self.activation_quantization_method = f"{quantization_type}_{range_calibration}"
        if range_calibration == "static":
            self.activation_quantizer = QuantAct(quant_mode=quantization_type)

    def quantize_input(self, input):
        """Dynamic: per token (each row of the last dimension) over its own range; static:
        over the running range."""
        if "static" in self.activation_quantization_method:
            return self.activation_quantizer(input, self.activation_quantization_bits)
        return quantize(input, self.activation_quantization_bits,
                        input.numel() // input.size(-1), self.activation_quantization_type)

    # -- masks ------------------------------------------------------------------------------------
    def get_mask(self, pruning_type="row"):
        if pruning_type == "sparse":
            if self.sparse_pruning_method == "l1":
                return self.sparse_pruning_mask
            return topk_mask(self.sparse_mask_scores, self.sparse_pruning_ratio)
        if pruning_type == "row":
            if self.row_pruning_method == "l1":
                return self.row_pruning_mask
            return topk_mask(self.row_mask_scores, self.row_pruning_ratio)
        if pruning_type == "head":
            if self.head_pruning_method == "l1":
                return self.head_pruning_mask
            return topk_mask(self.head_pruning_scores, self.head_pruning_ratio)
        raise NotImplementedError(pruning_type)

    def head_pruning_reshape(self, w, mask):
        rows, cols = w.shape
        return (w.t().reshape(self.num_heads, -1) * mask.view(-1, 1)).reshape(cols, rows).t()

    def quantized_weight(self, weight=None):
        """The weight quantized to the current (scheduled) bits."""
        weight = self.weight if weight is None else weight
        return quantize(weight, self.weight.start_bits, self.weight_quantize_num_groups,
                        self.weight_quantization_type, self.weight_quantization_stochastic)

    def compressed_weight_and_bias(self):
        weight, bias = self.weight, self.bias
        if self.weight_quantization_enabled_in_forward and self.weight_quantization_enabled:
            weight = self.quantized_weight()
        if self.sparse_pruning_enabled and self.sparse_pruning_method:
            weight = weight * self.get_mask("sparse")
        if self.row_pruning_enabled and self.row_pruning_method:
            mask = self.get_mask("row")
            weight = weight * mask.view(-1, 1)
            if bias is not None:
                bias = bias * mask.view(-1)
        if self.head_pruning_enabled and self.head_pruning_method:
            weight = self.head_pruning_reshape(weight, self.get_mask("head"))
        return weight, bias

    def forward(self, input, skip_bias_add=False):
        weight, bias = self.compressed_weight_and_bias()
        if self.activation_quantization_enabled and self.activation_quantization_method:
            input = self.quantize_input(input)
        if skip_bias_add:
            return nn.functional.linear(input, weight, None), bias
        return nn.functional.linear(input, weight, bias)

    # -- making it permanent (redundancy_clean) ---------------------------------------------------
    def _replace_weight(self, data) -> None:
        bits = (self.weight.start_bits, self.weight.target_bits, self.weight.q_period)
        self.weight = nn.Parameter(data.contiguous())
        self._set_bits(*bits)

    def fix_weight_quantization(self):
        if self.weight.target_bits is not None:
            with torch.no_grad():
                self.weight.data = quantize(self.weight.detach(), self.weight.target_bits,
                                            self.weight_quantize_num_groups,
                                            self.weight_quantization_type)
        self.weight_quantization_enabled_in_forward = False
        return None

    def fix_sparse_pruning_helper(self):
        with torch.no_grad():
            self.weight.data = self.weight.data * self.get_mask("sparse").detach()
        if self.sparse_pruning_method == "l1":
            del self.sparse_pruning_mask
        else:
            del self.sparse_mask_scores
        self.sparse_pruning_method = None
        self.sparse_pruning_enabled = False
        return None

    def fix_row_col_pruning_helper(self, mask=None, dim_reduction=False):
        if mask is None:  # this module's own rows
            mask = self.get_mask("row").detach().bool().view(-1)
            with torch.no_grad():
                if dim_reduction:
                    self._replace_weight(self.weight.data[mask, :])
                    if self.bias is not None:
                        self.bias = nn.Parameter(self.bias.data[mask])
                    self.out_features = self.weight.size(0)
                else:
                    self.weight.data = self.weight.data * mask.view(-1, 1)
                    if self.bias is not None:
                        self.bias.data = self.bias.data * mask
            if self.row_pruning_method == "l1":
                del self.row_pruning_mask
            else:
                del self.row_mask_scores
            self.row_pruning_method = None
        else:  # a related module: drop the input columns the pruned rows fed
            self._replace_weight(self.weight.data[:, mask.view(-1)])
            self.in_features = self.weight.size(1)
            mask = None
        self.row_pruning_enabled = False
        return mask

    def fix_head_pruning_helper(self, mask=None, num_heads=None, dim_reduction=False):
        num_heads = num_heads or self.num_heads
        if mask is None:  # the output projection: its input columns, by head
            mask = self.get_mask("head").detach().bool().view(-1)
            with torch.no_grad():
                if dim_reduction:
                    rows = self.weight.size(0)
                    kept = self.weight.data.t().reshape(num_heads, -1)[mask, :]
                    self._replace_weight(kept.reshape(-1, rows).t())
                    self.in_features = self.weight.size(1)
                else:
                    self.weight.data = self.head_pruning_reshape(self.weight.data, mask)
            if self.head_pruning_method == "l1":
                del self.head_pruning_mask
            else:
                del self.head_pruning_scores
            self.head_pruning_method = None
        else:  # q/k/v: drop the pruned heads' output rows
            cols = self.weight.size(1)
            self._replace_weight(self.weight.data.reshape(num_heads, -1)[mask.view(-1), :]
                                 .reshape(-1, cols))
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.data.reshape(num_heads, -1)[mask.view(-1), :]
                                         .reshape(-1))
            self.out_features = self.weight.size(0)
        self.head_pruning_enabled = False
        return mask
