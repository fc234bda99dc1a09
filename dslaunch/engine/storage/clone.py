"""``clone_tensors_for_torch_save`` (DeepSpeed's ``deepspeed.checkpoint.utils``; public in
``dslaunch.checkpoint.utils``): copies of the tensors in a state before ``torch.save``.

Why a copy: ``torch.save`` writes a tensor's whole storage. Under ZeRO 1-3 a parameter is a view
of its group's flat buffer, so saving it as it is writes the whole buffer once per view; a clone
owns exactly its elements (Accelerate clones every state dict it saves this way).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):  # noqa: B008 - immutable
    """``item`` with every tensor in it (through dicts, lists and tuples, nested) replaced by a
    detached copy on ``device``; anything else is returned as it is."""
    if torch.is_tensor(item):
        device = torch.device(device)
        # .to() copies when the device differs; clone() when it does not
        return item.detach().clone() if item.device == device else item.detach().to(device)
    if isinstance(item, dict):
        copied = [(k, clone_tensors_for_torch_save(v, device)) for k, v in item.items()]
        out = OrderedDict(copied) if isinstance(item, OrderedDict) else dict(copied)
        # a module state_dict's versions, which load_state_dict reads
        if isinstance(out, OrderedDict) and hasattr(item, "_metadata"):
            out._metadata = item._metadata
        return out
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        values = [clone_tensors_for_torch_save(v, device) for v in item]
        return type(item)(*values) if hasattr(item, "_fields") else tuple(values)
    return item
