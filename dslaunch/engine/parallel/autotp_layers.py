"""AutoTP's layer styles: a linear layer (or a GPT-2 ``Conv1D``) cut into its column- or
row-parallel part for this rank, holding the model's own Parameter objects (``keep_params``).
``autotp.py`` picks a style per layer name, ``autotp_specs.py`` per DeepSpeed's
``partition_config`` and ``autotp_head.py`` splits the LM head with ``keep_params`` too."""

from __future__ import annotations

import torch
import torch.nn as nn

from dslaunch.engine.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, group_rank, group_world
from dslaunch.engine.parallel.tp_plan import stacked_rows


def is_conv1d(m) -> bool:
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) \
        is not None and m.weight.dim() == 2


def as_linear(m) -> nn.Linear:
    """An ``nn.Linear`` view of a linear layer (a GPT-2 ``Conv1D`` transposed into one)."""
    if isinstance(m, nn.Linear):
        return m
    if is_conv1d(m):
        w = m.weight  # [in, out]
        lin = nn.Linear(w.shape[0], w.shape[1], bias=m.bias is not None, device="meta")
        lin.weight = nn.Parameter(w.detach().t().contiguous())
        if m.bias is not None:
            lin.bias = nn.Parameter(m.bias.detach().clone())
        lin.tp_conv1d = True
        return lin
    raise TypeError(f"AutoTP: {type(m).__name__} is not a linear layer")


MARKS = ("tensor_model_parallel", "partition_dim", "tp_full", "tp_ranges")


def keep_params(new, lin, orig):
    """``new`` (the parallel layer) holding ``orig``'s own Parameter objects, their data now this
    rank's slices: an optimizer or param groups built before ``initialize`` (the Hugging Face
    Trainer builds its own after ``tp_model_init``) still name the trained tensors."""
    for attr in ("weight", "bias"):
        old, part = getattr(orig, attr, None), getattr(new, attr, None)
        if not isinstance(old, nn.Parameter) or not isinstance(part, nn.Parameter):
            continue
        old.data = part.data
        for mark in MARKS:
            if hasattr(part, mark):
                setattr(old, mark, getattr(part, mark))
        if attr == "weight" and getattr(lin, "tp_conv1d", False):
            old.tp_conv1d = True  # held [out, in] now; saved back as the model's [in, out]
        new._parameters[attr] = old
    return new


def shard_span(rule, name, total, group):
    """(start, stop) of this rank's rows of layer ``name`` (``total`` of them) under ``rule``."""
    return rule.span(name, total, group_world(group), group_rank(group))


def column(m, group, rule=None, name=""):
    lin = as_linear(m)
    rows = None
    if rule is not None:
        rows = torch.arange(*shard_span(rule, name, lin.out_features, group), device="cpu")
    return keep_params(ColumnParallelLinear.from_linear(lin, group, rows=rows), lin, m)


def fused3(m, group, rule=None, name=""):
    """Three stacked equal parts (q | k | v), each cut alike."""
    lin = as_linear(m)
    span = None if rule is None else (lambda size: shard_span(rule, name, size, group))
    rows = stacked_rows(lin.out_features, (-1, -1, -1), group, span=span)
    return keep_params(ColumnParallelLinear.from_linear(lin, group, rows=rows), lin, m)


def row(m, group, rule=None, name=""):
    lin = as_linear(m)
    cols = shard_span(rule, name, lin.in_features, group) if rule is not None else None
    return keep_params(RowParallelLinear.from_linear(lin, group, cols=cols), lin, m)


def linear_like(m) -> bool:
    return isinstance(m, nn.Linear) or is_conv1d(m)
