"""The ``compression_training`` section, typed as DeepSpeed 0.18 read it (its
``deepspeed/compression/config.py`` keys and defaults), with a clear error naming the key path for
a wrong type or value. Pure data: no torch.

``parse(section)`` -> ``{method: {"shared": {...}, "groups": [Group, ...]}, "layer_reduction": {...}}``
for the six methods (weight_quantization, activation_quantization, sparse_pruning, row_pruning,
head_pruning, channel_pruning). A group's ``params`` are merged under the shared parameters, as
DeepSpeed merges them (a shared key wins).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

WEIGHT_QUANTIZATION = "weight_quantization"
ACTIVATION_QUANTIZATION = "activation_quantization"
SPARSE_PRUNING = "sparse_pruning"
ROW_PRUNING = "row_pruning"
HEAD_PRUNING = "head_pruning"
CHANNEL_PRUNING = "channel_pruning"
LAYER_REDUCTION = "layer_reduction"
METHODS = (WEIGHT_QUANTIZATION, ACTIVATION_QUANTIZATION, SPARSE_PRUNING, ROW_PRUNING,
           HEAD_PRUNING, CHANNEL_PRUNING)
# what dslaunch applies today; the others are parsed and refused when enabled (config/features.py)
IMPLEMENTED = METHODS

_BOOL, _INT, _FLOAT, _STR = "bool", "int", "float", "str"

# shared_parameters: key -> (kind, default, choices)
_SHARED = {
    WEIGHT_QUANTIZATION: {
        "enabled": (_BOOL, False, None), "quantizer_kernel": (_BOOL, False, None),
        "schedule_offset": (_INT, 0, None), "quantize_groups": (_INT, 1, None),
        "quantize_verbose": (_BOOL, False, None),
        "quantization_type": (_STR, "symmetric", ("symmetric", "asymmetric")),
        "rounding": (_STR, "nearest", ("nearest", "stochastic")),
        "quantize_weight_in_forward": (_BOOL, False, None),
        "fp16_mixed_quantize": ("dict", None, None),
    },
    ACTIVATION_QUANTIZATION: {
        "enabled": (_BOOL, False, None),
        "quantization_type": (_STR, "symmetric", ("symmetric", "asymmetric")),
        "range_calibration": (_STR, "dynamic", ("dynamic", "static")),
        "schedule_offset": (_INT, 1000, None),
    },
    SPARSE_PRUNING: {
        "enabled": (_BOOL, False, None), "method": (_STR, "l1", ("l1", "topk", "snip_momentum")),
        "schedule_offset": (_INT, 1000, None), "schedule_offset_end": (_INT, None, None),
        "schedule_offset_stride": (_INT, 1, None), "block_pattern": (_STR, "4x1", None),
        "dense_ratio": (_FLOAT, 0.1, None), "excluded_modules": ("list", [], None),
    },
    ROW_PRUNING: {
        "enabled": (_BOOL, False, None), "method": (_STR, "l1", ("l1", "topk")),
        "schedule_offset": (_INT, 1000, None),
    },
    HEAD_PRUNING: {
        "enabled": (_BOOL, False, None), "method": (_STR, "topk", ("topk", "l1")),
        "schedule_offset": (_INT, 1000, None), "num_heads": (_INT, None, None),
    },
    CHANNEL_PRUNING: {
        "enabled": (_BOOL, False, None), "method": (_STR, "l1", ("l1", "topk")),
        "schedule_offset": (_INT, 1000, None),
    },
}
# different_groups.<name>.params
_PARAMS = {
    WEIGHT_QUANTIZATION: {"start_bits": (_INT, None, None), "target_bits": (_INT, None, None),
                          "quantization_period": (_INT, 1, None)},
    ACTIVATION_QUANTIZATION: {"bits": (_INT, None, None)},
    SPARSE_PRUNING: {"dense_ratio": (_FLOAT, None, None)},
    ROW_PRUNING: {"dense_ratio": (_FLOAT, None, None)},
    HEAD_PRUNING: {"dense_ratio": (_FLOAT, None, None)},
    CHANNEL_PRUNING: {"dense_ratio": (_FLOAT, None, None)},
}
_LAYER_REDUCTION = {"enabled": (_BOOL, False, None), "keep_number_layer": (_INT, None, None),
                    "module_name_prefix": (_STR, "", None), "teacher_layer": ("list", [], None),
                    "other_module_name": ("list", [], None)}


class CompressionConfigError(ValueError):
    """A bad ``compression_training`` value; the message names the key path."""


@dataclass
class Group:
    name: str
    params: dict  # the group's params merged with the shared parameters
    modules: list = field(default_factory=lambda: ["*"])
    related_modules: list | None = None


def _check(path: str, value, kind: str, choices):
    ok = {_BOOL: lambda v: isinstance(v, bool),
          _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
          _FLOAT: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          _STR: lambda v: isinstance(v, str), "list": lambda v: isinstance(v, list),
          "dict": lambda v: isinstance(v, dict)}[kind](value)
    if not ok:
        raise CompressionConfigError(f"{path}: expected {kind}, got {value!r}")
    if choices is not None and value not in choices:
        raise CompressionConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}")
    return float(value) if kind == _FLOAT else value


def _typed(path: str, given, table: dict) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise CompressionConfigError(f"{path}: expected a section, got {given!r}")
    out = {}
    for key, value in given.items():
        if key not in table:
            raise CompressionConfigError(f"{path}.{key}: unknown key (valid: {', '.join(table)})")
        kind, _, choices = table[key]
        out[key] = value if value is None else _check(f"{path}.{key}", value, kind, choices)
    for key, (_, default, _) in table.items():
        out.setdefault(key, default)
    return out


def load(deepspeed_config) -> dict:
    """The config as a dict: a dict, a JSON file path, JSON text (what ``DSLAUNCH_CONFIG``
    carries), or an object carrying ``_param_dict``."""
    if isinstance(deepspeed_config, Mapping):
        return dict(deepspeed_config)
    if isinstance(deepspeed_config, str) and deepspeed_config.lstrip().startswith("{"):
        return json.loads(deepspeed_config)
    if isinstance(deepspeed_config, (str, os.PathLike)) and os.path.exists(deepspeed_config):
        with open(deepspeed_config) as f:
            return json.load(f)
    for attr in ("_param_dict", "param_dict"):
        if isinstance(getattr(deepspeed_config, attr, None), dict):
            return getattr(deepspeed_config, attr)
    raise CompressionConfigError("deepspeed_config: expected a dict or the path of an existing "
                                 f"config file, got {deepspeed_config!r}")


def _plain(value):
    """Plain dicts and lists (the resolved config hands read-only mappings and tuples)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def parse(section) -> dict:
    """The typed ``compression_training`` section (``section`` may be the whole config)."""
    section = _plain(section)
    if isinstance(section, dict) and "compression_training" in section:
        section = section["compression_training"]
    section = section or {}
    root = "compression_training"
    if not isinstance(section, dict):
        raise CompressionConfigError(f"{root}: expected a section, got {section!r}")
    for key in section:
        if key not in METHODS + (LAYER_REDUCTION,):
            raise CompressionConfigError(f"{root}.{key}: unknown key (valid: "
                                         f"{', '.join(METHODS + (LAYER_REDUCTION,))})")
    out = {}
    for method in METHODS:
        given = section.get(method) or {}
        for key in given:
            if key not in ("shared_parameters", "different_groups"):
                raise CompressionConfigError(f"{root}.{method}.{key}: unknown key (valid: "
                                             "shared_parameters, different_groups)")
        shared = _typed(f"{root}.{method}.shared_parameters", given.get("shared_parameters"),
                        _SHARED[method])
        if method == SPARSE_PRUNING and shared["schedule_offset_end"] is None:
            shared["schedule_offset_end"] = shared["schedule_offset"]
        if method == WEIGHT_QUANTIZATION:
            shared["fp16_mixed_quantize"] = _typed(
                f"{root}.{method}.shared_parameters.fp16_mixed_quantize",
                shared["fp16_mixed_quantize"],
                {"enabled": (_BOOL, False, None), "quantize_change_ratio": (_FLOAT, 0.001, None)})
        groups = []
        different = given.get("different_groups") or {}
        if shared["enabled"] and not different:
            raise CompressionConfigError(f"{root}.{method}.different_groups: an enabled method "
                                         "needs at least one group")
        for name, group in different.items():
            gpath = f"{root}.{method}.different_groups.{name}"
            if not isinstance(group, dict):
                raise CompressionConfigError(f"{gpath}: expected a section, got {group!r}")
            for key in group:
                if key not in ("params", "modules", "related_modules"):
                    raise CompressionConfigError(f"{gpath}.{key}: unknown key (valid: params, "
                                                 "modules, related_modules)")
            params = _typed(f"{gpath}.params", group.get("params"), _PARAMS[method])
            params = {**shared, **params}  # a group's own value wins (dense_ratio)
            modules = group.get("modules", ["*"])
            if isinstance(modules, str):
                modules = [modules]
            related = group.get("related_modules")
            if related is not None:
                if not isinstance(related, list) or len(related) != len(modules) \
                        or not all(isinstance(r, list) for r in related):
                    raise CompressionConfigError(f"{gpath}.related_modules: one list of names "
                                                 "per entry of modules")
            if shared["enabled"]:
                _check_group(gpath, method, params)
            groups.append(Group(name, params, list(modules), related))
        out[method] = {"shared": shared, "groups": groups}
    reduction = _typed(f"{root}.{LAYER_REDUCTION}", section.get(LAYER_REDUCTION), _LAYER_REDUCTION)
    if reduction["enabled"]:
        layers = reduction["teacher_layer"]
        if not reduction["module_name_prefix"] or not layers \
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise CompressionConfigError(f"{root}.{LAYER_REDUCTION}: needs module_name_prefix (the "
                                         "blocks' list, e.g. transformer.h) and teacher_layer (the "
                                         "teacher's layer numbers the student keeps)")
    out[LAYER_REDUCTION] = reduction
    return out


def _check_group(gpath: str, method: str, params: dict) -> None:
    if method == WEIGHT_QUANTIZATION:
        start, target = params["start_bits"], params["target_bits"]
        if start is None or target is None:
            raise CompressionConfigError(f"{gpath}.params: start_bits and target_bits are required")
        if not 1 <= target <= start <= 32:
            raise CompressionConfigError(f"{gpath}.params: needs 1 <= target_bits <= start_bits "
                                         f"<= 32 (got {start} -> {target})")
        if target <= 2 and params["quantization_type"] != "symmetric":
            raise CompressionConfigError(f"{gpath}.params.target_bits: 1 and 2 bits (binary, "
                                         "ternary) are symmetric only")
        if params["quantization_period"] < 1:
            raise CompressionConfigError(f"{gpath}.params.quantization_period: must be >= 1")
    elif method == ACTIVATION_QUANTIZATION:
        if params["bits"] not in (4, 8):
            raise CompressionConfigError(f"{gpath}.params.bits: 4 or 8")
    else:
        ratio = params["dense_ratio"]
        if ratio is None or not 0.0 < ratio <= 1.0:
            raise CompressionConfigError(f"{gpath}.params.dense_ratio: a fraction in (0, 1] "
                                         f"(got {ratio!r})")
        if method == HEAD_PRUNING and not params.get("num_heads"):
            raise CompressionConfigError(f"{gpath}: head_pruning needs shared_parameters.num_heads")


def unimplemented(section) -> list:
    """The ``path: why`` lines for enabled parts of the section dslaunch does not apply yet."""
    section = _plain(section)
    if not isinstance(section, dict):
        return []
    lines = []
    for method in METHODS:
        shared = (section.get(method) or {}).get("shared_parameters") or {}
        if not shared.get("enabled"):
            continue
        if method not in IMPLEMENTED:
            lines.append(f"compression_training.{method}: not supported yet (dslaunch applies "
                         "weight and activation quantization, sparse, row and head pruning, "
                         "layer reduction)")
        elif method == SPARSE_PRUNING and shared.get("method") == "snip_momentum":
            lines.append("compression_training.sparse_pruning.shared_parameters.method: "
                         "snip_momentum is not supported (it needs Intel neural_compressor); use "
                         "l1 or topk")
        elif method == WEIGHT_QUANTIZATION and (shared.get("fp16_mixed_quantize") or {}).get(
                "enabled"):
            lines.append("compression_training.weight_quantization.shared_parameters."
                         "fp16_mixed_quantize: not supported yet")
    return lines
