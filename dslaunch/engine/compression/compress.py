"""``init_compression`` and ``redundancy_clean`` (``deepspeed.compression.compress``, DeepSpeed
0.18's semantics; DeepSpeed 0.19 removed the library).

``init_compression(model, deepspeed_config)``: for each enabled method's group, the modules whose
name matches one of the group's ``modules`` (``re.search``; ``*`` means all) among the model's
``nn.Linear`` become ``LinearLayer_Compress`` (same tensors), and the method is set up on them
(masks computed, scores created, bits recorded). Nothing applies until the scheduler reaches the
method's ``schedule_offset`` (the engine steps it; ``compression_scheduler`` by hand otherwise).
Within a method a module belongs to one group: a second match is an error, as DeepSpeed's.

``redundancy_clean(model, deepspeed_config)``: makes every method permanent in the order weight
quantization, sparse, row, head pruning: the weight takes its quantized / masked values, and
where a group names ``related_modules`` the pruned rows (and the related modules' matching input
columns) or heads (and the related q/k/v output rows) are removed, so the model shrinks and gives
the same outputs as the masked one.
"""

from __future__ import annotations

import re

from torch import nn

from dslaunch.config.compression import (
    HEAD_PRUNING,
    IMPLEMENTED,
    ROW_PRUNING,
    SPARSE_PRUNING,
    WEIGHT_QUANTIZATION,
    CompressionConfigError,
    load,
    parse,
    unimplemented,
)

from .layers import LinearLayer_Compress

ORDER = (WEIGHT_QUANTIZATION, SPARSE_PRUNING, ROW_PRUNING, HEAD_PRUNING)


def _inner(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def _compressible(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear)


def get_module_name(group_name, model, key_word, exist_module_name, mpu=None, verbose=True):
    """The names of the compressible modules matching ``key_word`` not taken yet; a taken one is
    an error when ``verbose`` (DeepSpeed's rule)."""
    names = []
    pattern = ".*" if key_word == "*" else key_word
    for name, module in model.named_modules():
        if not name or not _compressible(module) or re.search(pattern, name) is None:
            continue
        if name in exist_module_name:
            if verbose:
                raise ValueError(f"{name} is already added to compression, please check your "
                                 f"config file for {group_name}.")
            continue
        exist_module_name.add(name)
        names.append(name)
    return names, exist_module_name


def _plan(model, methods: dict, verbose=True):
    """``[(method, group params, [[module names] per modules entry], [[[related]]] or None)]``
    for the enabled methods."""
    plan = []
    for method in ORDER:
        if not methods[method]["shared"]["enabled"]:
            continue
        taken = set()
        for group in methods[method]["groups"]:
            names = [get_module_name(group.name, model, kw, taken, verbose=verbose)[0]
                     for kw in group.modules]
            related = None
            if group.related_modules:
                related = [[get_module_name(group.name, model, kw, set(), verbose=False)[0]
                            for kw in kws] for kws in group.related_modules]
            if any(names):
                plan.append((method, group.params, names, related))
    return plan


def _methods(deepspeed_config) -> dict:
    section = load(deepspeed_config).get("compression_training") or {}
    refused = unimplemented(section)
    if refused:
        raise CompressionConfigError(refused[0])
    return parse(section)


def _submodule(model, name):
    return model.get_submodule(name)


def _replace(model, name) -> LinearLayer_Compress:
    module = _submodule(model, name)
    if isinstance(module, LinearLayer_Compress):
        return module
    new = LinearLayer_Compress.from_linear(module)
    parent, _, leaf = name.rpartition(".")
    setattr(_submodule(model, parent) if parent else model, leaf, new)
    return new


def init_compression(model, deepspeed_config, teacher_model=None, mpu=None):
    """Swap the chosen ``nn.Linear`` for ``LinearLayer_Compress`` and set each method up."""
    if mpu is not None:
        raise NotImplementedError("compression of tensor-parallel layers (mpu=) is not supported")
    methods = _methods(deepspeed_config)
    c_model = _inner(model)
    for method, params, names, _ in _plan(c_model, methods):
        for name in (n for entry in names for n in entry):
            layer = _replace(c_model, name)
            if method == WEIGHT_QUANTIZATION:
                layer.enable_weight_quantization(
                    params["start_bits"], params["target_bits"], params["quantization_period"],
                    params["quantize_weight_in_forward"], params["quantization_type"],
                    params["quantize_groups"], params["rounding"])
                layer._bits_schedule = (params["start_bits"], params["target_bits"],
                                        params["quantization_period"])
            elif method == SPARSE_PRUNING:
                layer.enable_sparse_pruning(params["dense_ratio"], params["method"])
            elif method == ROW_PRUNING:
                layer.enable_row_pruning(params["dense_ratio"], params["method"])
            elif method == HEAD_PRUNING:
                layer.enable_head_pruning(params["dense_ratio"], params["method"],
                                          params["num_heads"])
    return model


def redundancy_clean(model, deepspeed_config, mpu=None):
    """Make the compression permanent; remove pruned rows / heads where related modules are named."""
    if mpu is not None:
        raise NotImplementedError("compression of tensor-parallel layers (mpu=) is not supported")
    methods = _methods(deepspeed_config)
    c_model = _inner(model)
    for method, params, names, related in _plan(c_model, methods):
        reduce = bool(related)
        for i, entry in enumerate(names):
            masks = []
            for name in entry:
                layer = _submodule(c_model, name)
                if not isinstance(layer, LinearLayer_Compress):
                    continue  # init_compression did not touch it
                masks.append(_fix(layer, method, params, None, reduce))
            if not reduce:
                continue
            for related_names in related[i]:  # one keyword's matches, paired with the masks
                for j, name in enumerate(related_names):
                    layer = _submodule(c_model, name)
                    if not isinstance(layer, LinearLayer_Compress):
                        layer = _replace(c_model, name)
                    _fix(layer, method, params, masks[j], True)
    return model


def _fix(layer, method, params, mask, dim_reduction):
    if method == WEIGHT_QUANTIZATION:
        return layer.fix_weight_quantization()
    if method == SPARSE_PRUNING:
        return layer.fix_sparse_pruning_helper()
    if method == ROW_PRUNING:
        return layer.fix_row_col_pruning_helper(mask, dim_reduction=dim_reduction)
    return layer.fix_head_pruning_helper(mask, params["num_heads"], dim_reduction=dim_reduction)


__all__ = ["init_compression", "redundancy_clean", "get_module_name", "IMPLEMENTED"]
