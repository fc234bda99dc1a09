"""``init_compression`` and ``redundancy_clean`` (``deepspeed.compression.compress``, DeepSpeed
0.18's semantics; DeepSpeed 0.19 removed the library).

``init_compression(model, deepspeed_config)``: for each enabled method's group, the modules whose
name matches one of the group's ``modules`` (``re.search``; ``*`` means all) among the model's
``nn.Linear`` become ``LinearLayer_Compress`` (same tensors), and the method is set up on them
(masks computed, scores created, bits recorded). Nothing applies until the scheduler reaches the
method's ``schedule_offset`` (the engine steps it; ``compression_scheduler`` by hand otherwise).
Within a method a module belongs to one group: a second match is an error, as DeepSpeed's.

Channel pruning works on ``nn.Conv2d`` (its related modules: Conv2d or BatchNorm2d), the other
methods on ``nn.Linear``.

``redundancy_clean(model, deepspeed_config)``: makes every method permanent in the order weight
quantization, sparse, row, head, channel pruning: the weight takes its quantized / masked values, and
where a group names ``related_modules`` the pruned rows (and the related modules' matching input
columns) or heads (and the related q/k/v output rows) are removed, so the model shrinks and gives
the same outputs as the masked one. Activation quantization stays in forward; weight
quantization is written only where it ran in forward (the MoQ path quantized the weights already).

``layer_reduction`` (``teacher_model=``): student layer ``i`` under ``module_name_prefix`` takes
the parameters of teacher layer ``teacher_layer[i]``, the ``other_module_name`` modules the
teacher's (``student_initialization``).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from dslaunch.config.compression import (
    ACTIVATION_QUANTIZATION,
    CHANNEL_PRUNING,
    HEAD_PRUNING,
    IMPLEMENTED,
    LAYER_REDUCTION,
    ROW_PRUNING,
    SPARSE_PRUNING,
    WEIGHT_QUANTIZATION,
    CompressionConfigError,
    load,
    parse,
    unimplemented,
)
from dslaunch.engine.features.compression.conv import BNLayer_Compress, Conv2dLayer_Compress
from dslaunch.engine.features.compression.layers import LinearLayer_Compress

ORDER = (WEIGHT_QUANTIZATION, SPARSE_PRUNING, ROW_PRUNING, HEAD_PRUNING, CHANNEL_PRUNING,
         ACTIVATION_QUANTIZATION)


def inner_model(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def _compressible(module: nn.Module, kinds=(nn.Linear,)) -> bool:
    return isinstance(module, kinds)


def _kinds(method: str, related: bool = False) -> tuple:
    """The module types a method compresses: channel pruning Conv2d (a related module may be a
    Conv2d or a BatchNorm2d), the others nn.Linear."""
    if method == CHANNEL_PRUNING:
        return (nn.Conv2d, nn.BatchNorm2d) if related else (nn.Conv2d,)
    return (nn.Linear,)


def get_module_name(group_name, model, key_word, exist_module_name, mpu=None, verbose=True,
                    kinds=(nn.Linear,)):
    """The names of the compressible modules matching ``key_word`` not taken yet; a taken one is
    an error when ``verbose`` (DeepSpeed's rule)."""
    names = []
    pattern = ".*" if key_word == "*" else key_word
    for name, module in model.named_modules():
        if not name or not _compressible(module, kinds) or re.search(pattern, name) is None:
            continue
        if name in exist_module_name:
            if verbose:
                raise ValueError(f"{name} is already added to compression, please check your "
                                 f"config file for {group_name}.")
            continue
        exist_module_name.add(name)
        names.append(name)
    return names, exist_module_name


def compression_plan(model, methods: dict, verbose=True):
    """``[(method, group params, [[module names] per modules entry], [[[related]]] or None)]``
    for the enabled methods."""
    plan = []
    for method in ORDER:
        if not methods[method]["shared"]["enabled"]:
            continue
        taken = set()
        for group in methods[method]["groups"]:
            names = [get_module_name(group.name, model, kw, taken, verbose=verbose,
                                     kinds=_kinds(method))[0] for kw in group.modules]
            related = None
            if group.related_modules:
                related = [[get_module_name(group.name, model, kw, set(), verbose=False,
                                            kinds=_kinds(method, related=True))[0]
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


def _replace(model, name):
    module = _submodule(model, name)
    if isinstance(module, (LinearLayer_Compress, Conv2dLayer_Compress, BNLayer_Compress)):
        return module
    if isinstance(module, nn.Conv2d):
        new = Conv2dLayer_Compress.from_conv(module)
    elif isinstance(module, nn.BatchNorm2d):
        new = BNLayer_Compress.from_bn(module)
    else:
        new = LinearLayer_Compress.from_linear(module)
    parent, _, leaf = name.rpartition(".")
    setattr(_submodule(model, parent) if parent else model, leaf, new)
    return new


def init_compression(model, deepspeed_config, teacher_model=None, mpu=None):
    """Swap the chosen ``nn.Linear`` for ``LinearLayer_Compress`` and set each method up."""
    if mpu is not None:
        raise NotImplementedError("compression of tensor-parallel layers (mpu=) is not supported")
    methods = _methods(deepspeed_config)
    c_model = inner_model(model)
    if methods[LAYER_REDUCTION]["enabled"]:
        if teacher_model is None:
            raise ValueError("compression_training.layer_reduction needs teacher_model=")
        student_initialization(c_model, inner_model(teacher_model), methods[LAYER_REDUCTION])
    for method, params, names, _ in compression_plan(c_model, methods):
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
            elif method == ACTIVATION_QUANTIZATION:
                layer.enable_activation_quantization(params["bits"], params["quantization_type"],
                                                     params["range_calibration"])
            elif method == CHANNEL_PRUNING:
                layer.enable_channel_pruning(params["dense_ratio"], params["method"])
            elif method == HEAD_PRUNING:
                layer.enable_head_pruning(params["dense_ratio"], params["method"],
                                          params["num_heads"])
    return model


def student_initialization(student_model, teacher_model, layer_reduction: dict) -> None:
    """Layer reduction: student layer ``i`` under ``module_name_prefix`` takes the parameters of
    teacher layer ``teacher_layer[i]``, and each module of ``other_module_name`` the teacher's."""
    prefix = layer_reduction["module_name_prefix"]
    teacher_layer = layer_reduction["teacher_layer"]
    keep = layer_reduction["keep_number_layer"]
    if keep is not None and keep != len(teacher_layer):
        raise ValueError(f"compression_training.layer_reduction: keep_number_layer {keep} but "
                         f"{len(teacher_layer)} teacher_layer entries")
    pairs = [(f"{prefix}.{i}", f"{prefix}.{t}") for i, t in enumerate(teacher_layer)]
    pairs += [(name, name) for name in layer_reduction["other_module_name"]]
    with torch.no_grad():
        for s_name, t_name in pairs:
            s_params = list(student_model.get_submodule(s_name).parameters())
            t_params = list(teacher_model.get_submodule(t_name).parameters())
            if [p.shape for p in s_params] != [p.shape for p in t_params]:
                raise ValueError(f"layer_reduction: student {s_name} and teacher {t_name} "
                                 "differ in parameter shapes")
            for s_param, t_param in zip(s_params, t_params):
                s_param.copy_(t_param)


def redundancy_clean(model, deepspeed_config, mpu=None):
    """Make the compression permanent; remove pruned rows / heads where related modules are named."""
    if mpu is not None:
        raise NotImplementedError("compression of tensor-parallel layers (mpu=) is not supported")
    methods = _methods(deepspeed_config)
    c_model = inner_model(model)
    for method, params, names, related in compression_plan(c_model, methods):
        reduce = bool(related)
        for i, entry in enumerate(names):
            masks = []
            for name in entry:
                layer = _submodule(c_model, name)
                if not isinstance(layer, (LinearLayer_Compress, Conv2dLayer_Compress)):
                    continue  # init_compression did not touch it
                masks.append(_fix(layer, method, params, None, reduce))
            if not reduce:
                continue
            for related_names in related[i]:  # one keyword's matches, paired with the masks
                for j, name in enumerate(related_names):
                    layer = _replace(c_model, name)
                    _fix(layer, method, params, masks[j], True)
    return model


def _fix(layer, method, params, mask, dim_reduction):
    if method == ACTIVATION_QUANTIZATION:
        return None  # it stays in forward, as DeepSpeed's
    if method == WEIGHT_QUANTIZATION:  # the forward path only: MoQ's weights are quantized already
        return layer.fix_weight_quantization() if params["quantize_weight_in_forward"] else None
    if method == SPARSE_PRUNING:
        return layer.fix_sparse_pruning_helper()
    if method == CHANNEL_PRUNING:
        return layer.fix_channel_pruning_helper(mask, dim_reduction=dim_reduction)
    if method == ROW_PRUNING:
        return layer.fix_row_col_pruning_helper(mask, dim_reduction=dim_reduction)
    return layer.fix_head_pruning_helper(mask, params["num_heads"], dim_reduction=dim_reduction)


__all__ = ["init_compression", "redundancy_clean", "get_module_name", "student_initialization",
           "IMPLEMENTED"]
