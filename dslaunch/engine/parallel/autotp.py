"""AutoTP: tensor parallelism for Hugging Face models without a hand-written plan (DeepSpeed's
``"tensor_parallel": {"autotp_size": N}`` and ``deepspeed.tp_model_init(model, tp_size, dtype)``).

``initialize`` builds the ``data x model`` grid (``topology.build_grid(model=N)``; the
data-parallel size becomes world / N), reads the model's linear layers by their names and writes
the plan ``tp_plan.apply_tp_plan`` applies, so AutoTP is the hand-written machinery with the plan
found instead of written:

- column (output features split, output left split): the attention's query / key / value
  projections (``q_proj k_proj v_proj``; GPT-NeoX's head-interleaved ``query_key_value``; GPT-2's
  fused ``c_attn``, each of its three parts split alike) and the MLP's up projections
  (``gate_proj up_proj``, ``fc1``, ``dense_h_to_4h``, GPT-2's ``c_fc``);
- row (input features split, partial products all-reduced, bias added once): the attention's
  output projection (``o_proj``, ``dense``, ``c_proj``) and the MLP's down projection
  (``down_proj``, ``fc2``, ``dense_4h_to_h``, ``c_proj``);
- the untied LM head: split by vocabulary with its logits all-gathered (DeepSpeed 0.19.8's
  training default), or with ``vocab_parallel_lm_head: true`` its logits left split and the loss
  computed on them (``autotp_head.py``); a tied one stays whole (and tied);
- everything else whole on every rank: embeddings, norms, and any linear layer the rules do not
  know (correct, only not split).

Attention heads are split in whole heads, MLP layers near-evenly, by DeepSpeed's rule
(``autotp_shards.py``): when N does not divide the key/value heads (or the MLP width), the first
ranks hold one more, as under DeepSpeed; every rank needs one key/value head at least. The
attention modules of these families reshape with ``-1`` heads, so they run on their local heads
unchanged; GPT-2's, which splits its fused output by ``split_size``, gets its local sizes. GPT-2's ``Conv1D`` layers
(weight stored ``[in, out]``) become linear ones; their parameters carry ``tp_conv1d`` so the
gathered state dict (``gather_tp_state``) is written back in the model's own layout.

DeepSpeed's ``partition_config`` layer specs and ``preset_model`` replace the rules above when
given, and cut unevenly by the same rule (``autotp_specs.py``).

ZeRO 1-3 compose: the engine's ZeRO strategy partitions each TP rank's slices over its data
group. Checkpoints resume at another data-parallel size (each TP rank's shards re-cut from its own
old data ranks' files, ``checkpoint/zero_shards.data_ranks``); a ZeRO 3 one only at its TP size
(its shards hold TP slices; ``checkpoint/save_load.py`` refuses another TP size, to-fp32 and
to-universal refuse it).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn

from dslaunch.engine.parallel.autotp_layers import column, fused3, linear_like, row
from dslaunch.engine.parallel.autotp_shards import ShardRule, kv_heads
from dslaunch.engine.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, group_world
from dslaunch.engine.parallel.tp_plan import apply_tp_plan

# the model's last leaf name -> style; "c_proj" is row in both of GPT-2's blocks
COLUMN = ("q_proj", "k_proj", "v_proj", "query_key_value", "gate_proj", "up_proj", "fc1",
          "dense_h_to_4h", "c_fc")
FUSED3 = ("c_attn",)
ROW = ("o_proj", "down_proj", "dense", "fc2", "dense_4h_to_h", "c_proj")

_RECORDED_ATTR = "ds_autotp_tp_size"  # tp_model_init's record on the model


def _cut_by(plan: dict, rule: ShardRule) -> dict:
    """The built-in styles of ``plan``, each told its layer's name and the shard rule."""
    return {name: functools.partial(style, rule=rule, name=name) for name, style in plan.items()}


def autotp_plan(model: nn.Module) -> dict:
    """``{module name: style}`` for every linear layer of ``model`` the rules above know (the
    LM head, split afterwards by ``autotp_head.py``, and layers outside the decoder blocks'
    attention / MLP are left out)."""
    plan = {}
    for name, m in model.named_modules():
        if not name or not linear_like(m):
            continue
        leaf = name.rpartition(".")[2]
        if "lm_head" in name or "embed" in name:
            continue
        if leaf in FUSED3:
            plan[name] = fused3
        elif leaf in COLUMN:
            plan[name] = column
        elif leaf in ROW:
            plan[name] = row
    if not plan:
        raise ValueError(f"AutoTP: found no attention or MLP linear layer to split in "
                         f"{type(model).__name__} (known names: {', '.join(COLUMN + FUSED3 + ROW)})"
                         "; write a plan for dslaunch.engine.parallel.tp_plan.apply_tp_plan instead")
    return plan


def _model_config(model):
    cfg = getattr(model, "config", None)
    return getattr(cfg, "text_config", None) or cfg


def check_heads(model: nn.Module, tp: int) -> None:
    """Every rank needs one key/value head at least (a rank with none would hold empty
    attention layers)."""
    cfg = _model_config(model)
    if cfg is None:
        return
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    kv = kv_heads(cfg) or heads
    if isinstance(kv, int) and kv < tp:
        raise ValueError(f"tensor_parallel.autotp_size: {tp} ranks but the model has {kv} "
                         "key/value heads: some rank would hold no head; use a size of at most "
                         f"{kv}")


def _fix_attention_sizes(model: nn.Module) -> None:
    """Attention modules that split a fused projection by a stored size (GPT-2's ``split_size``)
    get this rank's sizes."""
    for m in model.modules():
        if hasattr(m, "c_attn") and isinstance(m.c_attn, ColumnParallelLinear) \
                and hasattr(m, "split_size"):
            local = m.c_attn.out_per_rank // 3
            m.num_heads = local // (m.embed_dim // m.num_heads)
            m.split_size = m.embed_dim = local


def _grain(section):
    """``tensor_parallel.tp_grain_size``, or DeepSpeed's nested ``tp.tp_grain_size``."""
    nested = ((getattr(section, "extra", None) or {}).get("tp") or {}).get("tp_grain_size")
    return nested if nested is not None else getattr(section, "tp_grain_size", 1)


def apply_autotp(model: nn.Module, group, section=None) -> nn.Module:
    """Split ``model`` in place over ``group`` (this rank keeps its slice of every split
    layer); returns it. With one rank in the group the plan is only checked. ``section``: the
    config's ``tensor_parallel`` section (``vocab_parallel_lm_head``; ``partition_config``,
    ``preset_model`` and ``tp_grain_size``: ``autotp_specs.py``)."""
    from dslaunch.engine.parallel.autotp_specs import spec_plan, specs_from_config, sum_grads_over

    tp = group_world(group)
    given = specs_from_config(section) if section is not None else None
    check_heads(model, tp)
    rule = ShardRule(kv_heads(_model_config(model)), _grain(section))
    # partition_config / preset_model: their specs alone decide which layers split (DeepSpeed's
    # rule); the cut is the same either way
    if given:
        plan, summed = spec_plan(model, *given, linear_like, rule)
    else:
        plan, summed = _cut_by(autotp_plan(model), rule), []
    apply_tp_plan(model, plan, group)
    if tp > 1:
        sum_grads_over(summed, group)
    if tp > 1 and getattr(section, "vocab_parallel_lm_head", False):
        from dslaunch.engine.parallel.autotp_head import split_lm_head

        split_lm_head(model, group, _grain(section))
    elif tp > 1 and not given:
        from dslaunch.engine.parallel.autotp_head import gather_lm_head

        gather_lm_head(model, group, _grain(section))
    if tp > 1:
        _fix_attention_sizes(model)
        model.ds_autotp_parsed = True
        # every TP rank's rows of every split parameter: a checkpoint names them so that another
        # TP size can re-split the optimizer state (checkpoint/autotp_states.py)
        model.ds_autotp_layout = _gathered_layout(model, group, tp)
    return model


def _gathered_layout(model: nn.Module, group, tp: int) -> dict | None:
    """Every TP rank's rows of every split parameter; None for a replacement rank built alone
    (a planned group: no collective yet), which takes the layout from a live peer when it joins
    (``recovery/state.load_engine_state``)."""
    from dslaunch.engine.parallel.tensor_parallel import PlannedGroup

    if isinstance(group, PlannedGroup):
        return None
    mine = {n: q.tp_ranges for n, q in model.named_parameters()
            if getattr(q, "tensor_model_parallel", False)}
    ranges = [None] * tp
    dist.all_gather_object(ranges, mine, group=group)
    return {"tp_size": tp, "ranges": ranges}


# -- where the size comes from --------------------------------------------------------------------

def tp_model_init(model: nn.Module, tp_size: int, dtype=None, config=None, **kwargs) -> nn.Module:
    """DeepSpeed's ``tp_model_init``: records the tensor-parallel size (and casts to ``dtype``
    when given); the split itself happens in ``initialize``, which takes this size when the
    config has no ``tensor_parallel.autotp_size`` and refuses a config that says otherwise."""
    if kwargs.get("tp_group") is not None:
        raise ValueError("tp_model_init: tp_group= is not supported; dslaunch builds the "
                         "tensor-parallel group from the world size (ranks r..r+tp-1)")
    size = int(tp_size)
    if size < 1:
        raise ValueError(f"tp_model_init: tp_size must be >= 1, got {tp_size}")
    setattr(model, _RECORDED_ATTR, size)
    if dtype is not None:
        model.to(dtype)
    return model


def config_autotp_size(source) -> int:
    """``tensor_parallel.autotp_size`` (or its alias ``tp_size``) of the config; 0 when absent
    (a bad value is left for the config validation to report)."""
    from dslaunch.config import load_config

    try:
        section = load_config(source).get("tensor_parallel") or {}
    except Exception:
        return 0
    size = section.get("autotp_size", section.get("tp_size", 0))
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def autotp_size(source, model) -> int:
    """The job's AutoTP size: the config's, else ``tp_model_init``'s record; 1 for none."""
    written, recorded = config_autotp_size(source), getattr(model, _RECORDED_ATTR, None)
    if written and recorded and written != recorded:
        raise ValueError(f"tensor_parallel.autotp_size: the config asks for {written} but "
                         f"tp_model_init recorded tp_size={recorded}; make them agree")
    return max(written or recorded or 1, 1)


def autotp_mpu(source, model, mpu, sequence: int = 1):
    """For an AutoTP job: the ``data x model`` grid (with ``sequence`` when the config asks for
    sequence parallelism), or ``mpu`` when it already has that tensor-parallel size; None / the
    given mpu otherwise. Also returns the size (1: no AutoTP) and whether the grid is ours (then,
    as in DeepSpeed, the config's batch triad counts every rank but sequence-parallel ones: the
    tensor-parallel ranks too, and the Hugging Face Trainer fills ``train_batch_size`` so)."""
    size = autotp_size(source, model)
    if size == 1:
        return mpu, 1, False
    from dslaunch.engine.parallel.pipe.module import PipelineModule

    if isinstance(model, PipelineModule):
        raise ValueError("tensor_parallel.autotp_size: not for a PipelineModule (give its "
                         "layers a tensor-parallel plan and the grid instead)")
    if mpu is not None:
        ask = getattr(mpu, "get_model_parallel_world_size", None) or getattr(
            mpu, "get_tensor_model_parallel_world_size", None)
        have = int(ask()) if ask is not None else 1
        if have != size:
            raise ValueError(f"tensor_parallel.autotp_size: {size} but the mpu's tensor-parallel "
                             f"size is {have}; make them agree (or pass no mpu)")
        return mpu, size, False
    from dslaunch.engine.parallel.topology import build_grid

    # (a replacement rank, built alone before it joins: the planned grid it will have)
    return build_grid(model=size, sequence=sequence), size, True


# -- whole weights back ------------------------------------------------------------------------

def has_tp_splits(module: nn.Module) -> bool:
    return any(getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_ranges")
               for p in module.parameters())


def _tp_group_of(module: nn.Module):
    for m in module.modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and group_world(m.group) > 1:
            return m.group
    return None


def gather_tp_state(state: dict, module: nn.Module) -> dict:
    """``state`` (a state dict of ``module``'s own names, this rank's slices) with every
    tensor-parallel slice replaced by the whole tensor, in the layout of the model before the
    split (GPT-2's Conv1D weights transposed back). Collective over the tensor-parallel group:
    every rank of it calls it; every rank gets the whole tensors."""
    group = _tp_group_of(module)
    if group is None:
        return state
    split = {n: p for n, p in module.named_parameters(remove_duplicate=False)
             if getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_ranges")}
    w = dist.get_world_size(group)
    out = dict(state)
    for name, p in split.items():
        if name not in state:
            continue
        local = state[name].detach().contiguous()
        ranges = [None] * w
        dist.all_gather_object(ranges, p.tp_ranges, group=group)
        # uneven splits (autotp_shards.py): every rank sends the longest slice, padded
        longest = max(sum(b - a for a, b in rr) for rr in ranges)
        pad = list(local.shape)
        pad[p.partition_dim] = longest - local.shape[p.partition_dim]
        sent = torch.cat([local, local.new_zeros(pad)], p.partition_dim) if pad[p.partition_dim] \
            else local
        parts = [torch.empty_like(sent) for _ in range(w)]
        dist.all_gather(parts, sent, group=group)
        shape = list(local.shape)
        shape[p.partition_dim] = p.tp_full
        full = local.new_empty(shape)
        for part, rr in zip(parts, ranges):
            at = 0
            for start, stop in rr:
                n = stop - start
                full.narrow(p.partition_dim, start, n).copy_(part.narrow(p.partition_dim, at, n))
                at += n
        out[name] = full.t().contiguous() if getattr(p, "tp_conv1d", False) else full
    return out


def slice_tp_state(state: dict, module: nn.Module) -> dict:
    """The reverse of ``gather_tp_state`` for this rank: whole tensors (the model's own layout)
    cut to the slices ``module``'s split parameters hold. Local; entries already of the local
    shape are kept."""
    out = dict(state)
    for name, p in module.named_parameters(remove_duplicate=False):
        if name not in state or not getattr(p, "tensor_model_parallel", False) \
                or not hasattr(p, "tp_ranges"):
            continue
        full = state[name]
        if tuple(full.shape) == tuple(p.shape):  # already this rank's slice
            continue
        if getattr(p, "tp_conv1d", False):  # the model's [in, out] layout
            full = full.t()
        idx = torch.cat([torch.arange(a, b) for a, b in p.tp_ranges])
        out[name] = full.index_select(p.partition_dim, idx.to(full.device)).contiguous()
    return out
