"""Channel pruning of ``nn.Conv2d`` (DeepSpeed 0.18's ``Conv2dLayer_Compress`` and
``BNLayer_Compress``, channel pruning only): the output channels of a convolution masked, ``l1``
by each channel's L1 norm (fixed when enabled) or ``topk`` by learned scores
``channel_mask_scores``; ``fix_channel_pruning_helper`` writes the mask in or, with
``dim_reduction``, removes the pruned channels, and the returned mask removes the matching input
channels of a related convolution or the channels of a related ``BatchNorm2d``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dslaunch.engine.features.compression.quantize import topk_mask


class Conv2dLayer_Compress(nn.Conv2d):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.channel_pruning_method = None
        self.channel_pruning_enabled = False

    @classmethod
    def from_conv(cls, old: nn.Conv2d) -> "Conv2dLayer_Compress":
        new = cls(old.in_channels, old.out_channels, old.kernel_size, stride=old.stride,
                  padding=old.padding, dilation=old.dilation, groups=old.groups,
                  bias=old.bias is not None, padding_mode=old.padding_mode,
                  device=old.weight.device, dtype=old.weight.dtype)
        new.weight, new.bias = old.weight, old.bias
        new.train(old.training)
        return new

    def enable_channel_pruning(self, ratio, method):
        if self.groups != 1:
            raise ValueError("channel pruning of a grouped convolution is not supported")
        self.channel_pruning_ratio = ratio
        self.channel_pruning_method = method
        if method == "l1":
            norms = self.weight.detach().abs().sum(dim=(1, 2, 3))
            self.register_buffer("channel_pruning_mask",
                                 topk_mask(norms, ratio).detach().view(-1, 1, 1, 1))
        elif method == "topk":
            self.channel_mask_scores = nn.Parameter(
                torch.empty(self.out_channels, 1, 1, 1, device=self.weight.device))
            nn.init.kaiming_uniform_(self.channel_mask_scores, a=math.sqrt(5))
        else:
            raise NotImplementedError(f"channel pruning method {method!r}")

    def get_mask(self, pruning_type="channel"):
        if self.channel_pruning_method == "l1":
            return self.channel_pruning_mask
        return topk_mask(self.channel_mask_scores, self.channel_pruning_ratio)

    def forward(self, input):
        weight, bias = self.weight, self.bias
        if self.channel_pruning_enabled and self.channel_pruning_method:
            mask = self.get_mask()
            weight = weight * mask.view(-1, 1, 1, 1)
            if bias is not None:
                bias = bias * mask.view(-1)
        return self._conv_forward(input, weight, bias)

    def fix_channel_pruning_helper(self, mask=None, dim_reduction=False):
        if mask is None:  # this convolution's own output channels
            mask = self.get_mask().detach().bool().view(-1)
            with torch.no_grad():
                if dim_reduction:
                    self.weight = nn.Parameter(self.weight.data[mask].contiguous())
                    if self.bias is not None:
                        self.bias = nn.Parameter(self.bias.data[mask])
                    self.out_channels = self.weight.size(0)
                else:
                    self.weight.data = self.weight.data * mask.view(-1, 1, 1, 1)
                    if self.bias is not None:
                        self.bias.data = self.bias.data * mask
            if self.channel_pruning_method == "l1":
                del self.channel_pruning_mask
            else:
                del self.channel_mask_scores
            self.channel_pruning_method = None
        else:  # a related convolution: the input channels the pruned ones fed
            self.weight = nn.Parameter(self.weight.data[:, mask.view(-1)].contiguous())
            self.in_channels = self.weight.size(1)
            mask = None
        self.channel_pruning_enabled = False
        return mask


class BNLayer_Compress(nn.BatchNorm2d):
    @classmethod
    def from_bn(cls, old: nn.BatchNorm2d) -> "BNLayer_Compress":
        new = cls(old.num_features, eps=old.eps, momentum=old.momentum, affine=old.affine,
                  track_running_stats=old.track_running_stats, device=old.weight.device
                  if old.weight is not None else None)
        new.load_state_dict(old.state_dict())
        new.weight, new.bias = old.weight, old.bias
        new.train(old.training)
        return new

    def fix_channel_pruning_helper(self, mask, dim_reduction=True):
        keep = mask.view(-1)
        if self.weight is not None:
            self.weight = nn.Parameter(self.weight.data[keep])
            self.bias = nn.Parameter(self.bias.data[keep])
        if self.running_mean is not None:
            self.running_mean = self.running_mean[keep]
            self.running_var = self.running_var[keep]
        self.num_features = int(keep.sum())
        return None
