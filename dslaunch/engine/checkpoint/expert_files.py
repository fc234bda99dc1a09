"""MoE experts in a checkpoint: one file per expert, under DeepSpeed's name
``layer_{layer}_expert_{id}_mp_rank_00_model_states.pt`` ({parameter name with the global expert
id: tensor}), written by one replica of each expert (its expert-data-parallel rank 0).
``model_states.pt`` keeps the dense weights only. A job with another ``ep_size`` or world size
reads the files of the experts it holds and renames them to its local expert ids; ``dslaunch
ckpt to-fp32`` merges them all under their global names (``zero_to_fp32_script.py``).
"""

from __future__ import annotations

import os

from dslaunch.engine.experts import expert_group

from .files import CheckpointError, load_file

EXPERT_FILE = "layer_{}_expert_{}_mp_rank_00_model_states.pt"


def _names(engine) -> dict:
    groups = getattr(engine, "expert_groups", None)
    return groups.global_names(engine.module) if groups else {}


def split_module_state(engine, module_sd: dict) -> tuple[dict, dict]:
    """(``module_sd`` without the experts, {file name: {global name: tensor}} this rank
    writes)."""
    names = _names(engine)
    if not names:
        return module_sd, {}
    group_of = {n: expert_group(p) for n, p in engine.module.named_parameters()}
    dense = {k: v for k, v in module_sd.items() if k not in names}
    files: dict = {}
    for local, (name, layer, gid) in names.items():
        if local in module_sd and engine.expert_groups.writes_experts(group_of[local]):
            # a copy: the parameter may be a view of a flat buffer (saved whole otherwise)
            t = module_sd[local].detach().to("cpu", copy=True)
            files.setdefault(EXPERT_FILE.format(layer, gid), {})[name] = t
    return dense, files


def with_local_experts(engine, module_sd: dict, path: str) -> dict:
    """``module_sd`` (the dense weights of ``model_states.pt``) plus this rank's experts, read
    from their files under the model's local names."""
    names = _names(engine)
    if not names:
        return module_sd
    out, opened = dict(module_sd), {}
    for local, (name, layer, gid) in names.items():
        fpath = os.path.join(path, EXPERT_FILE.format(layer, gid))
        if fpath not in opened:
            if not os.path.isfile(fpath):
                raise CheckpointError(f"{fpath}: missing (the checkpoint holds no expert {gid} "
                                      f"of MoE layer {layer}; saved with fewer experts?)")
            opened[fpath] = load_file(fpath, mmap=True)
        if name not in opened[fpath]:
            raise CheckpointError(f"{fpath}: no tensor {name!r}")
        out[local] = opened[fpath][name]
    return out
