"""The module globals of DeepSpeed's ``partition_parameters`` that Transformers patches around
``zero.Init`` (``prevent_arange_dtype_change``, entered whenever a model is built under ZeRO-3).

DeepSpeed's ``zero.Init`` re-creates tensor constructors (``torch.empty``, ``torch.arange``, ...)
through ``zero_wrapper_for_fp_tensor_constructor`` so new floating-point tensors come out in the
model's dtype on the accelerator; Transformers swaps that wrapper to spare ``torch.arange`` (RoPE
buffers). dslaunch's ``Init`` does not touch tensor constructors (tensors keep the dtype and
device the model gives them; the engine casts parameters at ``initialize``), so nothing calls
the wrapper during a build and the patch changes nothing. The names exist, with DeepSpeed's
meaning, so that code runs; calling the wrapper yourself does what DeepSpeed's does.
"""

from __future__ import annotations

import torch

from dslaunch.accelerator.real_accelerator import get_accelerator

_orig_torch_arange = torch.arange  # the identity Transformers compares against


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype, target_device=None):
    """``fn`` (a tensor constructor) making its tensors on ``target_device`` (default: this
    rank's accelerator device) and floating-point ones in ``target_fp_dtype``."""

    def wrapped(*args, **kwargs):
        if kwargs.get("device") is None:
            kwargs["device"] = target_device or get_accelerator().current_device_name()
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped


__all__ = ["_orig_torch_arange", "get_accelerator", "zero_wrapper_for_fp_tensor_constructor"]
