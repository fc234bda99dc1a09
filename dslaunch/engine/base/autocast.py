"""``torch_autocast``: forward under ``torch.autocast``, parameters kept fp32, as DeepSpeed 0.19
applies the section.

- The engine's forward runs inside ``torch.autocast(device_type, dtype)`` (an autocast the
  script opened around it is overridden by the section's settings); backward replays the dtypes
  forward chose. Parameters, gradients, masters and optimizer states stay fp32: this is not the
  ``bf16`` section, which casts the model. Both together (DeepSpeed's bf16 master-weights example
  does it) give bf16 parameters with autocast's fp32 islands (softmax, norms, losses) in forward.
- Parameters of the lower-precision-safe modules (``lower_precision_safe_modules``: class names
  with their module; by default ``torch.nn.Linear`` and ``Conv1d/2d/3d``) get a *communication
  dtype*, the autocast dtype: ZeRO stages 1-3 reduce their gradients in it (half the bytes;
  ``partition.build_layout`` keeps such parameters in buckets of their own), then accumulate in
  fp32 again. Stage 0 reduces every gradient in fp32, as DeepSpeed does.
- fp16 autocast (it needs a gradient scaler) is refused by the config for now.
"""

from __future__ import annotations

import contextlib
import pkgutil

import torch

# DeepSpeed's dtype spellings -> torch dtypes (config/schema.py AUTOCAST_DTYPES lists them)
_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "torch.bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
           "torch.float16": torch.float16, "fp32": torch.float32, "float32": torch.float32,
           "float": torch.float32, "torch.float32": torch.float32}
DEFAULT_SAFE_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
COMM_DTYPE_ATTR = "_dsl_comm_dtype"  # on a parameter: reduce its gradient in this dtype


def comm_dtype(param) -> torch.dtype | None:
    """The dtype ``param``'s gradient is reduced in, when autocast gave it one."""
    return getattr(param, COMM_DTYPE_ATTR, None)


def _import_class(name: str):
    """The class a config names ("package.module.Class"): the user's module, not one of ours."""
    try:
        return pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"torch_autocast.lower_precision_safe_modules: cannot import {name!r} "
                         f"({e}); name each class with its module, e.g. \"torch.nn.Linear\"") \
            from None


class Autocast:
    """The section, resolved for one engine: ``region()`` wraps forward; ``mark(model)`` gives
    the safe modules' parameters their communication dtype."""

    def __init__(self, section, device_type: str):
        self.enabled = bool(section.enabled)
        self.device_type = device_type
        self.dtype = None
        self.safe_classes = ()
        if not self.enabled:
            return
        self.dtype = (_DTYPES[section.dtype] if section.dtype is not None
                      else torch.get_autocast_dtype(device_type))
        if self.dtype == torch.float16:
            raise ValueError("torch_autocast.dtype: fp16 autocast is not supported yet (it needs "
                             "a gradient scaler); set \"dtype\": \"bf16\"")
        names = section.lower_precision_safe_modules
        self.safe_classes = DEFAULT_SAFE_MODULES if names is None else tuple(
            _import_class(n) for n in names)

    def mark(self, model: torch.nn.Module) -> int:
        """Give the parameters that the safe modules own directly the autocast dtype as their
        communication dtype (exact class match, as DeepSpeed does); returns how many."""
        if not self.enabled or self.dtype == torch.float32:
            return 0
        count = 0
        for m in model.modules():
            if type(m) in self.safe_classes:
                for p in m.parameters(recurse=False):
                    setattr(p, COMM_DTYPE_ATTR, self.dtype)
                    count += 1
        return count

    def region(self):
        """The context forward runs in."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)
