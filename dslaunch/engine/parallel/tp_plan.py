"""Apply a tensor-parallel plan: a table that says, by module name, which layers of a model are
split over the ``model`` group and how. The model states its own plan (the example GPT's is
``examples/gpt_tp.py``); this module knows no model.

A plan maps a name pattern to a style::

    {"blocks.*.mlp.fc": "column", "blocks.*.mlp.proj": "row", "tok_emb": "vocab"}

Patterns are names as ``model.named_modules()`` gives them; ``*`` stands for one name
component. A style is one of ``STYLES`` or a callable ``(module, group) -> module`` for a layer
the built-in styles do not cover. Each matched module is replaced, slicing the full weights it
holds, so a TP run starts from exactly the single-process init.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from dslaunch.engine.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    divide,
    group_rank,
    group_world,
)


def _expect(module, kind, style):
    if not isinstance(module, kind):
        raise TypeError(f"tensor-parallel plan: style {style!r} needs an {kind.__name__}, got "
                        f"{type(module).__name__}")
    return module


def stacked_rows(out_features: int, parts: tuple, group, span=None) -> torch.Tensor:
    """Rows of a linear whose output is the stacked ``parts`` (their sizes; all -1: equal parts),
    e.g. a fused q/k/v or gate/up projection: this rank's block of every part, so the rank holds
    matching pieces of each. ``span(size)``: this rank's ``(start, stop)`` within a part of
    ``size`` rows (None: the even block, which the size must divide)."""
    if all(p == -1 for p in parts):
        if out_features % len(parts):  # (a count of parts, not the tensor-parallel size)
            raise ValueError(f"tensor-parallel plan: the layer's {out_features} output features "
                             f"are not {len(parts)} equal stacked parts")
        parts = (out_features // len(parts),) * len(parts)
    if sum(parts) != out_features:
        raise ValueError(f"tensor-parallel plan: the parts {tuple(parts)} do not add up to the "
                         f"layer's {out_features} output features")
    w, r, at, rows = group_world(group), group_rank(group), 0, []
    for size in parts:
        if span is None:
            local = divide(size, w, "features per fused part")
            start, stop = r * local, (r + 1) * local
        else:
            start, stop = span(size)
        # built on the CPU: real indices even when the layer lives on the meta device
        rows.append(torch.arange(at + start, at + stop, device="cpu"))
        at += size
    return torch.cat(rows)


def _fused3_rows(linear: nn.Linear, group) -> torch.Tensor:
    """Rows of a linear whose output is 3 stacked equal parts (a fused q/k/v projection)."""
    return stacked_rows(linear.out_features, (-1, -1, -1), group)


def _column_fused3(m, group):
    m = _expect(m, nn.Linear, "column_fused3")
    return ColumnParallelLinear.from_linear(m, group, rows=_fused3_rows(m, group))


# style -> (module, group) -> its tensor-parallel replacement
STYLES = {
    # output features split; the output stays split (feeds a "row" layer or a split loss)
    "column": lambda m, g: ColumnParallelLinear.from_linear(_expect(m, nn.Linear, "column"), g),
    # output features split, then gathered: callers see the full output
    "column_gather": lambda m, g: ColumnParallelLinear.from_linear(
        _expect(m, nn.Linear, "column_gather"), g, gather_output=True),
    # "column" for a layer whose output is 3 stacked parts, each split alike
    "column_fused3": _column_fused3,
    # input features split (the output of a "column" layer); partial outputs all-reduced
    "row": lambda m, g: RowParallelLinear.from_linear(_expect(m, nn.Linear, "row"), g),
    # embedding rows (the vocabulary) split in contiguous ranges; lookups all-reduced
    "vocab": lambda m, g: VocabParallelEmbedding.from_embedding(
        _expect(m, nn.Embedding, "vocab"), g),
}


def _pattern(p: str) -> re.Pattern:
    return re.compile(r"[^.]+".join(re.escape(part) for part in p.split("*")) + r"\Z")


def _converter(style):
    if callable(style):
        return style
    if style not in STYLES:
        raise ValueError(f"tensor-parallel plan: unknown style {style!r}; known: "
                         f"{', '.join(STYLES)} or a callable (module, group) -> module")
    return STYLES[style]


def apply_tp_plan(model: nn.Module, plan: dict, group) -> nn.Module:
    """Replace (in place) every submodule of ``model`` whose name matches a pattern of ``plan``
    by its style's tensor-parallel form; returns ``model``. Parents are converted before their
    children, and each module is looked up when its turn comes, so a callable style may replace
    a parent that keeps its children's names. A pattern matching no module, or a module
    matching two patterns, is an error (a plan written for another model), also when the group
    has one rank: then the plan is only checked and nothing is replaced."""
    split = group_world(group) > 1
    compiled = [(_pattern(p), p, _converter(s)) for p, s in plan.items()]
    unused = set(plan)
    for name in [n for n, _ in model.named_modules() if n]:  # pre-order: parents first
        hits = [(p, conv) for rx, p, conv in compiled if rx.match(name)]
        if len(hits) > 1:
            raise ValueError(f"tensor-parallel plan: {name!r} matches {[p for p, _ in hits]}")
        if not hits:
            continue
        unused.discard(hits[0][0])
        if not split:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, hits[0][1](getattr(parent, attr), group))
    if unused:
        raise ValueError(f"tensor-parallel plan: no module of {type(model).__name__} matches "
                         f"{sorted(unused)}")
    return model
