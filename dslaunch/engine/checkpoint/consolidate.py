"""A pipeline / tensor-parallel checkpoint -> one plain fp32 ``state_dict`` (``dslaunch ckpt
to-fp32`` on a ``dslaunch-pipe-1`` checkpoint), and loading it back into an unpartitioned model.

Naming: the names a ``PipelineModule`` gives its own parameters (DeepSpeed's too): ``N.<param>``
for the layer at index N of the layer list, ``tied_modules.<key>.<param>`` for a tied layer
(written once, from its first owner stage). So the file loads with ``load_state_dict`` into the
same layer list built as ``PipelineModule(..., num_stages=1)`` without TP, or, with
``load_consolidated``, into any stage of any pipeline of those layers.

Tensor-parallel slices are put back from what the save recorded in ``metadata.json``
(``shards["S_T"]["splits"]``: for each parameter marked ``tensor_model_parallel``, the dim, the
full size and the row ranges TP rank T holds; e.g. a fused qkv keeps three ranges per rank).
Unmarked tensors are replicated over TP ranks: TP rank 0's copy is taken. In bf16/fp16 the fp32
masters are used (stage 0: ``fp32_masters`` in the rank files, listed by ``param_names``; ZeRO 1:
the shards, gathered over the data-parallel ranks with the ZeRO consolidation's helpers), so the
result is the exact fp32 state the job trained. Files are opened memory-mapped and the output is
built one tensor at a time.
"""

from __future__ import annotations

import os

import torch

from .save_load import CheckpointError, resolve_tag
from ..topology import PipeModelDataParallelTopology
from .reshape import _load, _meta, _RankFiles
from ..zero.partition import Layout
from .shard_index import ParamIndex
from .pipeline import FORMAT, _layer_file


def is_pipe_checkpoint(ckpt_dir: str, tag=None) -> bool:
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    return _meta(os.path.join(ckpt_dir, tag)).get("format") == FORMAT


class _Masters:
    """fp32 master values of one (stage, TP rank), or nothing when the weights are fp32."""

    def __init__(self, meta, files: _RankFiles, topo, stage: int, tp: int):
        self.lookup = lambda name: None
        if meta.get("dtype", "fp32") == "fp32":
            return  # the layer files hold the exact fp32 weights
        zero = int(meta.get("zero_stage") or 0)
        rank0 = topo.get_rank(pipe=stage, data=0, model=tp)
        if zero == 0:
            names = meta["shards"][f"{stage}_{tp}"]["param_names"]
            masters = files.raw(rank0)["strategy"].get("fp32_masters")
            if masters is not None:
                table = dict(zip(names, masters))
                self.lookup = table.get
            return
        z0 = files.zero(rank0)
        where = {}
        for gi, g in enumerate(z0["groups"]):
            idx = ParamIndex(Layout.from_meta(g["layout"]))
            for name in idx.names():
                where[name] = (idx, gi)

        def lookup(name):
            if name not in where:
                return None
            idx, gi = where[name]
            return idx.gather(lambda k: files.zero(topo.get_rank(pipe=stage, data=k, model=tp))
                              ["groups"][gi]["master"], name)
        self.lookup = lookup

    def value(self, name: str, saved: torch.Tensor) -> torch.Tensor:
        m = self.lookup(name)
        if m is None:
            return saved.to(torch.float32).clone() if saved.is_floating_point() else saved.clone()
        return m.to(torch.float32).reshape(saved.shape).clone()


def _unsplit(name, split, pieces) -> torch.Tensor:
    """The full tensor from each TP rank's slice (``pieces[t]``) and their row ranges."""
    dim, full = split[0]["dim"], split[0]["full"]
    shape = list(pieces[0].shape)
    shape[dim] = full
    out = torch.empty(shape, dtype=pieces[0].dtype)
    filled = 0
    for sp, piece in zip(split, pieces):
        pos = 0
        for a, b in sp["ranges"]:
            out.narrow(dim, a, b - a).copy_(piece.narrow(dim, pos, b - a))
            pos += b - a
            filled += b - a
        if pos != piece.shape[dim]:
            raise CheckpointError(f"tensor {name!r}: TP slice of {piece.shape[dim]} rows along "
                                  f"dim {dim} but its recorded ranges cover {pos}")
    if filled != full:
        raise CheckpointError(f"tensor {name!r}: TP slices cover {filled} of {full} rows")
    return out


def to_fp32(ckpt_dir: str, out: str, tag=None) -> dict:
    """Write the consolidated fp32 state_dict of a pipeline/TP checkpoint to ``out``.
    Returns {"tensors", "tp_merged", "tied", "bytes"}."""
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    path = os.path.join(ckpt_dir, tag)
    meta = _meta(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a pipeline/TP checkpoint")
    pipe, tp, dp = int(meta["pipe"]), int(meta["tp"]), int(meta["dp"])
    if "shards" not in meta and (tp > 1 or meta.get("dtype", "fp32") != "fp32"):
        raise CheckpointError(f"{path}/metadata.json: no 'shards' (TP layout / parameter names): "
                              "written by an older dslaunch; save it again to consolidate")
    topo = PipeModelDataParallelTopology(num_pp=pipe, num_mp=tp, num_dp=dp)
    files = _RankFiles(path, int(meta["world_size"]))
    result, merged, tied, nbytes = {}, 0, 0, 0
    for s in range(pipe):
        layers = [_load(_layer_file(path, s, t)) for t in range(tp)]
        masters = [_Masters(meta, files, topo, s, t) for t in range(tp)]
        splits = [(meta.get("shards") or {}).get(f"{s}_{t}", {}).get("splits", {})
                  for t in range(tp)]
        for name, saved in layers[0].items():
            if name in result:  # a tied layer held by several stages: its first owner's copy
                tied += 1
                continue
            if name in splits[0]:
                pieces = [masters[t].value(name, layers[t][name]) for t in range(tp)]
                v = _unsplit(name, [splits[t][name] for t in range(tp)], pieces)
                merged += 1
            else:
                v = masters[0].value(name, saved)
            result[name] = v
            nbytes += v.numel() * v.element_size()
        del layers
    tmp = os.fspath(out) + ".part"
    torch.save(result, tmp)
    os.replace(tmp, out)
    return {"tensors": len(result), "tp_merged": merged, "tied": tied, "bytes": nbytes}


def load_consolidated(module, state, strict: bool = True):
    """Load a consolidated state_dict (a path or a dict) into ``module``: a ``PipelineModule``
    built without TP from the same layer list, on one stage or on this rank's stage of a
    pipeline (only the layers the stage holds are taken), or any module with the same names."""
    if not isinstance(state, dict):
        state = torch.load(state, map_location="cpu", weights_only=True)
    local = module.state_dict()
    mine = {k: v for k, v in state.items() if k in local}
    return module.load_state_dict(mine, strict=strict)
