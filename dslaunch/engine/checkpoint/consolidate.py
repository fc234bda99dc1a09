"""``dslaunch ckpt to-fp32``: a checkpoint -> one plain fp32 ``state_dict``, for both formats
(ZeRO 0-3 of ``save_load.py``, pipeline / tensor-parallel of ``pipeline.py``), and loading a
pipeline one back into an unpartitioned model.

Both stream: files are opened with ``torch.load(mmap=True, weights_only=True)``, so only the
pages of the tensors being copied are read. ZeRO 0-3 runs the standalone script's
``zero_checkpoint``: the output is allocated once, each rank file is mapped in turn and its master
shard copied into place, the copied pages given back at once (``madvise``), so the peak is about
one fp32 copy of the model; ``to_fp32`` writing one torch file fills the file in place and holds
far less (``write_zero_checkpoint``; ``benchmarks/bench_zero_to_fp32.py``). Pipeline / TP checkpoints are
built one parameter at a time, ZeRO 1-3 masters gathered by name (``shard_index.py``). Output
(``save_state_file``): one torch file, safetensors, or numbered shards + Hugging Face index json
(the script's ``write_output``).

ZeRO 0-3: stage 0 and stages 1-2 in fp32 keep exact fp32 weights in ``model_states.pt``; for
ZeRO 1-3 the fp32 master shards (exact in bf16/fp16 too) are reassembled from the rank files
(ZeRO 3's ``model_states.pt`` holds only placeholders of them, ``zero3_module.py``).

Pipeline / TP, naming: the names a ``PipelineModule`` gives its own parameters (DeepSpeed's too):
``N.<param>`` for the layer at index N of the layer list, ``tied_modules.<key>.<param>`` for a
tied layer (written once, from its first owner stage). So the file loads with
``load_state_dict`` into the same layer list built as ``PipelineModule(..., num_stages=1)``
without TP, or, with ``load_consolidated``, into any stage of any pipeline of those layers.

Tensor-parallel slices are put back from what the save recorded in ``metadata.json``
(``shards["S_T"]["splits"]``: for each parameter marked ``tensor_model_parallel``, the dim, the
full size and the row ranges TP rank T holds; e.g. a fused qkv keeps three ranges per rank).
Unmarked tensors are replicated over TP ranks: TP rank 0's copy is taken. In bf16/fp16 the fp32
masters are used (stage 0: ``fp32_masters`` in the rank files, listed by ``param_names``; ZeRO 1:
the shards, gathered over the data-parallel ranks), so the result is the exact fp32 state the
job trained. Layer files are opened memory-mapped too.
"""

from __future__ import annotations

import contextlib
import os

import torch

from dslaunch.engine.parallel.topology import PipeModelDataParallelTopology
from dslaunch.engine.storage.files import CheckpointError, RankFiles, load_file, model_file, read_meta, resolve_tag
from dslaunch.engine.storage.pipe_files import FORMAT, layer_file
from dslaunch.engine.storage.shard_index import gather_master, param_locations
from dslaunch.engine.storage.zero_to_fp32_script import (
    check_output_options,
    write_output,
    write_zero_checkpoint,
    zero_checkpoint,
)

# -- shared by both formats --------------------------------------------------------------------

def _load(path: str):
    """A file of the checkpoint being read: mapped, so only the pages copied out are read."""
    return load_file(path, mmap=True, detail=False)


def _fp32(saved: torch.Tensor) -> torch.Tensor:
    """A copy of a saved tensor, floating point ones in fp32 (integer buffers as they are)."""
    return saved.to(torch.float32).clone() if saved.is_floating_point() else saved.clone()


def check_output(max_shard_size=None, safe_serialization: bool = False) -> None:
    """A CheckpointError now for output options that cannot be honoured (no safetensors, a
    shard size that is no size), before any consolidating."""
    try:
        check_output_options(max_shard_size, safe_serialization)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def save_state_file(result: dict, out, max_shard_size=None,
                    safe_serialization: bool = False) -> str:
    """Write a consolidated state_dict (``write_output``: a file, or a directory of shards and
    their index), every file under a temporary name then renamed. Returns the path written."""
    try:
        return write_output(result, out, max_shard_size, safe_serialization)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


# -- ZeRO 0-3 checkpoints ----------------------------------------------------------------------

def to_fp32(ckpt_dir: str, out: str, tag=None, max_shard_size=None,
            safe_serialization: bool = False, exclude=()) -> dict:
    """Write the consolidated fp32 state_dict of ``ckpt_dir`` (tag or ``latest``) to ``out`` (a
    file, or a directory: ``write_output``); one torch file is written in place, never whole in
    memory (``write_zero_checkpoint``). Names in ``exclude`` are left out. Returns {"tensors",
    "params_from_shards", "bytes", "path"}."""
    check_output(max_shard_size, safe_serialization)
    path, meta = _zero_checkpoint_dir(ckpt_dir, tag)
    with _as_checkpoint_errors(path):
        written, count, nbytes = write_zero_checkpoint(path, meta, out, max_shard_size,
                                                       safe_serialization, set(exclude))
    sharded = sum(1 for _ in _sharded_names(path, meta))
    return {"tensors": count, "params_from_shards": sharded, "bytes": nbytes, "path": written}


def fp32_state_dict(ckpt_dir: str, tag=None) -> tuple[dict, dict]:
    """The consolidated fp32 state_dict of a ZeRO 0-3 checkpoint, and ``to_fp32``'s summary.

    Streams (the standalone script's ``zero_checkpoint``, one implementation for both): the
    output is allocated once, then each rank file is mapped in turn, its master shard copied into
    place and its pages given back, so the peak is about one fp32 copy of the model."""
    path, meta = _zero_checkpoint_dir(ckpt_dir, tag)
    with _as_checkpoint_errors(path):
        result = zero_checkpoint(path, meta)
    sharded = sum(1 for _ in _sharded_names(path, meta))
    nbytes = sum(v.numel() * v.element_size() for v in result.values())
    return result, {"tensors": len(result), "params_from_shards": sharded, "bytes": nbytes}


def _zero_checkpoint_dir(ckpt_dir, tag) -> tuple[str, dict]:
    """The tag's directory and its metadata; a clear error when its model file is missing."""
    path = os.path.join(ckpt_dir, resolve_tag(os.fspath(ckpt_dir), tag))
    meta = read_meta(path)
    if not os.path.isfile(model_file(path)):
        raise CheckpointError(f"{model_file(path)}: checkpoint file not found")
    return path, meta


@contextlib.contextmanager
def _as_checkpoint_errors(path: str):
    """The reader's KeyError / ValueError / RuntimeError, as the CheckpointError users see."""
    try:
        yield
    except KeyError as e:
        raise CheckpointError(f"{path}: not a dslaunch ZeRO checkpoint (no {e} entry)") from None
    except (ValueError, RuntimeError) as e:
        raise CheckpointError(str(e)) from None


def _sharded_names(path: str, meta: dict):
    if int(meta.get("zero_stage") or 0) not in (1, 2, 3):
        return
    z0 = RankFiles(path, 1).zero(0)
    for g in z0["groups"]:
        for b in g["layout"]["buckets"]:
            for p in b["params"]:
                yield p[0]


# -- pipeline / tensor-parallel checkpoints ----------------------------------------------------

class _Masters:
    """fp32 master values of one (stage, TP rank), or nothing when the weights are fp32."""

    def __init__(self, meta, files: RankFiles, topo, stage: int, tp: int):
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
        where = param_locations(files.zero(rank0))

        def lookup(name):
            if name not in where:
                return None
            return gather_master(files, where, name,
                                  lambda k: topo.get_rank(pipe=stage, data=k, model=tp))
        self.lookup = lookup

    def value(self, name: str, saved: torch.Tensor) -> torch.Tensor:
        m = self.lookup(name)
        if m is None:
            return _fp32(saved)
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


def pipe_to_fp32(ckpt_dir: str, out: str, tag=None, max_shard_size=None,
                 safe_serialization: bool = False) -> dict:
    """Write the consolidated fp32 state_dict of a pipeline/TP checkpoint to ``out``.
    Returns {"tensors", "tp_merged", "tied", "bytes", "path"}."""
    check_output(max_shard_size, safe_serialization)
    result, info = pipe_fp32_state_dict(ckpt_dir, tag)
    info["path"] = save_state_file(result, out, max_shard_size, safe_serialization)
    return info


def pipe_fp32_state_dict(ckpt_dir: str, tag=None) -> tuple[dict, dict]:
    """The consolidated fp32 state_dict of a pipeline/TP checkpoint, and ``pipe_to_fp32``'s
    summary."""
    tag = resolve_tag(os.fspath(ckpt_dir), tag)
    path = os.path.join(ckpt_dir, tag)
    meta = read_meta(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a pipeline/TP checkpoint")
    pipe, tp, dp = int(meta["pipe"]), int(meta["tp"]), int(meta["dp"])
    if "shards" not in meta and (tp > 1 or meta.get("dtype", "fp32") != "fp32"):
        raise CheckpointError(f"{path}/metadata.json: no 'shards' (TP layout / parameter names): "
                              "written by an older dslaunch; save it again to consolidate")
    topo = PipeModelDataParallelTopology(num_pp=pipe, num_mp=tp, num_dp=dp)
    files = RankFiles(path, int(meta["world_size"]))
    result, merged, tied, nbytes = {}, 0, 0, 0
    for s in range(pipe):
        layers = [_load(layer_file(path, s, t)) for t in range(tp)]
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
    return result, {"tensors": len(result), "tp_merged": merged, "tied": tied, "bytes": nbytes}


def frozen_names(ckpt_dir: str, tag=None) -> set:
    """Names of the parameters the job did not train (``requires_grad=False``), as its
    ``metadata.json`` records them (checkpoints written before dslaunch recorded them: none)."""
    meta = read_meta(os.path.join(ckpt_dir, resolve_tag(os.fspath(ckpt_dir), tag)))
    names = set(meta.get("frozen_params", []))
    for shard in (meta.get("shards") or {}).values():
        names.update(shard.get("frozen_params", []))
    return names


def load_consolidated(module, state, strict: bool = True):
    """Load a consolidated state_dict (a path or a dict) into ``module``: a ``PipelineModule``
    built without TP from the same layer list, on one stage or on this rank's stage of a
    pipeline (only the layers the stage holds are taken), or any module with the same names."""
    if not isinstance(state, dict):
        state = torch.load(state, map_location="cpu", weights_only=True)
    local = module.state_dict()
    mine = {k: v for k, v in state.items() if k in local}
    return module.load_state_dict(mine, strict=strict)
