"""DeepSpeed's configurable AutoTP keys: ``tensor_parallel.partition_config`` (layer specs for
layers the built-in rules miss), ``tensor_parallel.preset_model`` (a named set of specs) and
``tensor_parallel.tp_grain_size``.

``partition_config``::

    {"use_default_specs": true, "strict_mode": false,
     "layer_specs": [{"patterns": [".*\\\\.o_proj\\\\.weight$"], "partition_type": "row"},
                     {"patterns": [".*\\\\.gate_up_proj\\\\.weight$"], "partition_type": "column",
                      "shape": [2, -1], "partition_dim": 0}]}

A spec's ``patterns`` (regular expressions, matched from the start as ``re.match`` does) are
tried on ``<module name>.weight`` of every linear layer, first matching spec wins; ``model_types``
limits a spec to models whose ``config.model_type`` is listed. As in DeepSpeed, once specs are
given they alone decide: an unmatched layer stays whole (``strict_mode``: an error). A preset's
specs come after the custom ones when both are given and ``use_default_specs`` is true (the
custom ones alone otherwise).

What each spec can say here:

- ``partition_type`` ``column`` (output rows split; ``gather_output`` gathers the output back),
  ``row`` (input columns split, the partial products all-reduced) or ``skip`` (whole; with
  ``grad_allreduce`` its gradient is summed over the tensor-parallel ranks, for a replicated
  weight that sees only this rank's heads, e.g. Qwen3's q/k norms);
- ``shape`` ``[k, -1]`` or ``[[a, b, c], -1]`` on a column layer: the output rows are ``k``
  equal (or the listed) stacked parts, each split alike, so every rank holds matching parts.

Every split follows the built-in rules' cut (``autotp_shards.ShardRule``, DeepSpeed 0.19.8's: a
spec layer, and each stacked part of one, is cut as DeepSpeed's spec layers cut it): whole
key/value heads for attention layers, grains of ``tp_grain_size`` for MLP layers, unevenly where
the size does not divide.

Refused, naming the key: other shapes or partition dims (3-D expert views), ``row`` with a
``shape``, a spec on an embedding or a row-parallel LM head, and presets other than ``PRESETS``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist
import torch.nn as nn

from dslaunch.engine.parallel.autotp_shards import ShardRule
from dslaunch.engine.parallel.tensor_parallel import ColumnParallelLinear
from dslaunch.engine.parallel.tp_plan import stacked_rows

KEY = "tensor_parallel.partition_config"
SPEC_KEYS = {"patterns", "partition_type", "shape", "partition_dim", "model_types",
             "gather_output", "grad_allreduce"}
CONFIG_KEYS = {"layer_specs", "use_default_specs", "strict_mode", "tp_size",
               "embedding_partition_dim", "lm_head_patterns"}

_LLAMA = [
    {"patterns": [r".*\.self_attn\.o_proj\.weight$"], "partition_type": "row"},
    {"patterns": [r".*\.self_attn\.[qkv]_proj\.weight$"], "partition_type": "column"},
    {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "row"},
    {"patterns": [r".*\.mlp\.(up|gate)_proj\.weight$"], "partition_type": "column"},
]
# preset name -> its specs (DeepSpeed's names; the layer names of those Hugging Face families)
PRESETS = {"llama": _LLAMA, "qwen2": _LLAMA}
REFUSED_PRESETS = ("bloom", "chatglm", "mixtral", "deepseek_v2", "phi3")


@dataclass
class Spec:
    patterns: list
    kind: str  # column | row | skip
    parts: tuple | None = None  # column: the sizes of the stacked parts (None: one part)
    gather_output: bool = False
    grad_allreduce: bool = False
    model_types: tuple | None = None

    def matches(self, weight_name: str, model_type) -> bool:
        if self.model_types and str(model_type).lower() not in self.model_types:
            return False
        return any(re.match(p, weight_name) for p in self.patterns)


def _fail(where: str, why: str):
    raise ValueError(f"{where}: {why}")


def _parts(shape, where: str, kind: str, dim):
    """The stacked parts' sizes (-1 entries: equal parts) of a column spec's ``shape``."""
    if shape is None:
        return None
    if kind != "column":
        _fail(f"{where}.shape", f"only column specs take a shape here (this one is {kind!r})")
    if (dim or 0) != 0 or not isinstance(shape, (list, tuple)) or len(shape) != 2 \
            or shape[1] != -1:
        _fail(f"{where}.shape", f"{shape!r}: only [k, -1] or [[a, b, ...], -1] with "
              "partition_dim 0 (stacked output parts) is supported; 3-D views are not")
    first = shape[0]
    if isinstance(first, int) and first > 0:
        return (-1,) * first
    if isinstance(first, (list, tuple)) and first and all(
            isinstance(v, int) and v > 0 for v in first):
        return tuple(first)
    _fail(f"{where}.shape", f"{shape!r}: the first entry must be a part count or a list of "
          "positive part sizes")


def parse_spec(raw, where: str) -> Spec:
    if not isinstance(raw, Mapping):
        _fail(where, f"a layer spec is an object, got {type(raw).__name__}")
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        _fail(where, f"unknown keys {sorted(unknown)}; a spec takes {sorted(SPEC_KEYS)}")
    patterns = raw.get("patterns")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, (list, tuple)) or not patterns or not all(
            isinstance(p, str) for p in patterns):
        _fail(f"{where}.patterns", "give a non-empty list of regular expressions")
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            _fail(f"{where}.patterns", f"{p!r} is not a regular expression ({e})")
    kind = str(raw.get("partition_type", "column")).lower()
    if kind not in ("column", "row", "skip"):
        _fail(f"{where}.partition_type", f"{kind!r}; use column, row or skip")
    dim = raw.get("partition_dim")
    default_dim = {"column": 0, "row": 1}.get(kind)
    if dim is not None and kind != "skip" and dim != default_dim:
        _fail(f"{where}.partition_dim", f"{dim} on a {kind} layer: only {default_dim} (the "
              "weight's output rows for column, input columns for row) is supported")
    gather = bool(raw.get("gather_output", False))
    if gather and kind != "column":
        _fail(f"{where}.gather_output", "only column specs gather their output")
    grad_ar = bool(raw.get("grad_allreduce", False))
    if grad_ar and kind != "skip":
        _fail(f"{where}.grad_allreduce", "only skip specs (replicated weights) take it")
    parts = _parts(raw.get("shape"), where, kind, dim)
    if parts is not None and gather:
        _fail(f"{where}.gather_output", "not with a shape (stacked parts)")
    types = raw.get("model_types")
    return Spec(list(patterns), kind, parts, gather, grad_ar,
                tuple(str(t).lower() for t in types) if types else None)


def specs_from_config(section) -> tuple[list, bool] | None:
    """``(specs, strict)`` from the ``tensor_parallel`` section's ``preset_model`` and
    ``partition_config``; None when neither is given (the built-in rules apply)."""
    preset = getattr(section, "preset_model", None)
    custom = getattr(section, "partition_config", None)
    if preset is None and custom is None:
        return None
    base = []
    if preset is not None:
        name = str(preset).lower()
        if name in REFUSED_PRESETS:
            _fail("tensor_parallel.preset_model", f"{preset!r} is DeepSpeed's, not supported "
                  f"here; supported: {sorted(PRESETS)} (or write its layers in "
                  f"{KEY}.layer_specs)")
        if name not in PRESETS:
            _fail("tensor_parallel.preset_model", f"unknown preset {preset!r}; supported: "
                  f"{sorted(PRESETS)}")
        base = [parse_spec(s, f"preset {name}") for s in PRESETS[name]]
    if custom is None:
        return base, False
    if not isinstance(custom, Mapping):
        _fail(KEY, f"give an object with layer_specs, got {type(custom).__name__}")
    unknown = set(custom) - CONFIG_KEYS
    if unknown:
        _fail(KEY, f"unknown keys {sorted(unknown)}; it takes {sorted(CONFIG_KEYS)}")
    if custom.get("embedding_partition_dim", 1) != 1:
        _fail(f"{KEY}.embedding_partition_dim", "embeddings stay whole here; leave it out")
    raw = custom.get("layer_specs", [])
    if not isinstance(raw, (list, tuple)):
        _fail(f"{KEY}.layer_specs", "give a list of layer specs")
    specs = [parse_spec(s, f"{KEY}.layer_specs[{i}]") for i, s in enumerate(raw)]
    if base and custom.get("use_default_specs", True):
        specs = specs + base
    if not specs:
        _fail(f"{KEY}.layer_specs", "no layer spec given (and no preset_model)")
    return specs, bool(custom.get("strict_mode", False))


# -- styles -----------------------------------------------------------------------------------

def style_of(spec: Spec, rule: ShardRule, name: str):
    """The plan style (``(module, group) -> module``) of a column or row spec for layer
    ``name``, cut by ``rule``."""
    from dslaunch.engine.parallel.autotp_layers import as_linear, column, keep_params, row, shard_span

    if spec.kind == "row":
        return functools.partial(row, rule=rule, name=name)
    if spec.parts is None and not spec.gather_output:
        return functools.partial(column, rule=rule, name=name)

    def column(m, group):
        lin = as_linear(m)
        try:  # each stacked part cut by the rule as a layer of its own (DeepSpeed's sub-parameters)
            rows = stacked_rows(lin.out_features, spec.parts or (-1,), group,
                                span=lambda size: shard_span(rule, name, size, group))
        except ValueError as e:
            raise ValueError(f"{KEY}: {name}: {e}") from None
        layer = ColumnParallelLinear.from_linear(lin, group, gather_output=spec.gather_output,
                                                 rows=rows)
        return keep_params(layer, lin, m)

    return column


def _model_type(model):
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None)


def spec_plan(model: nn.Module, specs: list, strict: bool, linear_like,
              rule: ShardRule | None = None) -> tuple[dict, list]:
    """``({module name: style}, [weights whose gradient is summed over the TP group])``; every
    split layer cut by ``rule`` (None: by grains of 1, near-even)."""
    rule = rule or ShardRule(None)
    mtype = _model_type(model)
    plan, summed = {}, []
    for name, m in model.named_modules():
        if not name:
            continue
        weight = f"{name}.weight"
        spec = next((s for s in specs if s.matches(weight, mtype)), None)
        if isinstance(m, nn.Embedding) and spec is not None and spec.kind != "skip":
            _fail(KEY, f"{weight} is an embedding; embeddings stay whole here (use skip)")
        if not linear_like(m):
            continue
        if spec is None:
            if strict:
                _fail(f"{KEY}.strict_mode", f"no layer spec matches {weight}")
            continue
        if spec.kind == "skip":
            if spec.grad_allreduce:
                summed += [p for p in m.parameters(recurse=False) if p.requires_grad]
            continue
        if spec.kind == "row" and any(h in name for h in ("lm_head", "embed_out")):
            _fail(KEY, f"{weight}: a row-parallel LM head is not supported (use column, with "
                  "gather_output, or vocab_parallel_lm_head)")
        plan[name] = style_of(spec, rule, name)
    if not plan:
        _fail(KEY, f"no layer spec matches a linear layer of {type(model).__name__}")
    return plan, summed


class _SumOverGroup:
    """The gradient hook of ``sum_grads_over``; kept on the parameter (``ds_tp_grad_sum``) so
    that in-process recovery can point it at the rebuilt group (``engine/recovery/grid.py``)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=self.group)
        return grad


def sum_grads_over(params: list, group) -> None:
    """Gradient hooks: each of ``params`` (replicated, but fed by this rank's heads only) gets
    the sum of the tensor-parallel ranks' gradients."""
    for p in params:
        p.ds_tp_grad_sum = _SumOverGroup(group)
        p.register_hook(p.ds_tp_grad_sum)
