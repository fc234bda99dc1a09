"""MoE experts in a checkpoint: one file per expert, under DeepSpeed's name
``layer_{layer}_expert_{id}_mp_rank_00_model_states.pt`` ({parameter name with the global expert
id: tensor}), written by one replica of each expert (its expert-data-parallel rank 0).
``model_states.pt`` keeps the dense weights only. Expert parameters that hold several experts in
one tensor (AutoEP's fused slices) go to ``expert_slices_{group}_ep_rank_{r}_model_states.pt`` per
expert-parallel rank instead: they load back at the same ep size only (and ``to-fp32`` leaves
them out). A job with another ``ep_size`` or world size
reads the files of the experts it holds and renames them to its local expert ids; ``dslaunch
ckpt to-fp32`` merges them all under their global names (``zero_to_fp32_script.py``).
"""

from __future__ import annotations

import os

from dslaunch.engine.parallel.experts import expert_group
from dslaunch.engine.storage.files import CheckpointError, load_file

EXPERT_FILE = "layer_{}_expert_{}_mp_rank_00_model_states.pt"
# expert parameters not under ``deepspeed_experts.{id}`` (AutoEP's fused slices of all local
# experts): kept per expert-parallel rank, so they load back at the same ep size only
SLICE_FILE = "expert_slices_{}_ep_rank_{:02d}_model_states.pt"


def _names(engine) -> dict:
    groups = getattr(engine, "expert_groups", None)
    return groups.global_names(engine.module) if groups else {}


def _open(opened: dict, fpath: str, what: str):
    if fpath not in opened:
        if not os.path.isfile(fpath):
            raise CheckpointError(f"{fpath}: missing ({what})")
        opened[fpath] = load_file(fpath, mmap=True)
    return opened[fpath]


def split_module_state(engine, module_sd: dict) -> tuple[dict, dict]:
    """(``module_sd`` without the experts, {file name: {global name: tensor}} this rank
    writes)."""
    if not getattr(engine, "expert_groups", None):
        return module_sd, {}
    names = _names(engine)
    group_of = {n: expert_group(p) for n, p in engine.module.named_parameters()}
    dense = {k: v for k, v in module_sd.items() if k not in names}
    files: dict = {}
    groups = engine.expert_groups
    for local, (name, layer, gid) in names.items():
        if local in module_sd and groups.writes_experts(group_of[local]):
            # a copy: the parameter may be a view of a flat buffer (saved whole otherwise)
            t = module_sd[local].detach().to("cpu", copy=True)
            files.setdefault(EXPERT_FILE.format(layer, gid), {})[name] = t
    for local, group in _slices(engine, names):
        dense.pop(local, None)
        if local in module_sd and groups.writes_experts(group):
            fname = SLICE_FILE.format(group, groups.ep_rank[group])
            files.setdefault(fname, {})[local] = module_sd[local].detach().to("cpu", copy=True)
    return dense, files


def _slices(engine, names: dict) -> list:
    """[(local name, group name)] of the expert parameters without a global expert id."""
    return [(n, expert_group(p)) for n, p in engine.module.named_parameters()
            if expert_group(p) is not None and n not in names]


def with_local_experts(engine, module_sd: dict, path: str) -> dict:
    """``module_sd`` (the dense weights of ``model_states.pt``) plus this rank's experts, read
    from their files under the model's local names."""
    names = _names(engine)
    groups = getattr(engine, "expert_groups", None)
    if not groups:
        return module_sd
    out, opened = dict(module_sd), {}
    for local, (name, layer, gid) in names.items():
        fpath = os.path.join(path, EXPERT_FILE.format(layer, gid))
        saved = _open(opened, fpath, f"the checkpoint holds no expert {gid} of MoE layer "
                                     f"{layer}; saved with fewer experts?")
        if name not in saved:
            raise CheckpointError(f"{fpath}: no tensor {name!r}")
        out[local] = saved[name]
    for local, group in _slices(engine, names):
        fpath = os.path.join(path, SLICE_FILE.format(group, groups.ep_rank[group]))
        saved = _open(opened, fpath, f"expert slices of {group} rank {groups.ep_rank[group]}: "
                                     "saved with another ep size? these load at the same one")
        if local not in saved:
            raise CheckpointError(f"{fpath}: no tensor {local!r}")
        out[local] = saved[local]
    return out
