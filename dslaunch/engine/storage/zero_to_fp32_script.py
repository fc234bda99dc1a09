#!/usr/bin/env python
"""Consolidate the dslaunch checkpoints of this folder into one fp32 state_dict, with torch alone.

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT [-t TAG] [--exclude_frozen_parameters]
                           [--safe_serialization] [--max_shard_size 5GB]

CHECKPOINT_DIR is the folder holding ``latest`` (where this script was written). OUTPUT is a
directory when it exists as one, ends with ``/`` or ``--max_shard_size`` is given: then, as
DeepSpeed's script writes, ``pytorch_model.bin`` (``model.safetensors`` with
``--safe_serialization``) goes in it, or, above the shard size (default 5GB), numbered shards
(``pytorch_model-00001-of-00003.bin``...) and the Hugging Face index
(``pytorch_model.bin.index.json`` / ``model.safetensors.index.json``: ``metadata.total_size``,
``weight_map`` name -> file). Otherwise OUTPUT is the one file written. The result loads with
``torch.load(OUTPUT, weights_only=True)`` (or ``safetensors.torch.load_file``) and
``model.load_state_dict``; ``dslaunch ckpt to-fp32`` gives the same. dslaunch's
``save_checkpoint`` writes this file beside its checkpoints (as DeepSpeed does its own
``zero_to_fp32.py``) so that the weights can be recovered where dslaunch is not installed: it
imports nothing of dslaunch (safetensors only for ``--safe_serialization``). Its source is
dslaunch's ``engine/storage/zero_to_fp32_script.py``; dslaunch's own consolidation imports
its output writer and page release from there.

Formats: ZeRO 0-3 (``model_states.pt``; for ZeRO 1-3 the fp32 masters are put back together from
the ranks' shards in ``rank_{r}_optim_states.pt``: at ZeRO 3 ``model_states.pt`` keeps only
empty placeholders of those weights, listed under ``zero3_partitioned``; MoE experts from their
``layer_{l}_expert_{e}_mp_rank_00_model_states.pt`` files and shards, under their global expert
ids; with AutoTP each TP rank's slices gathered from its data ranks' shards and put back whole,
``autotp_checkpoint``) and pipeline / tensor parallel
(``layer_stage{S}_tp{T}_model_states.pt``; tensor-parallel slices merged, fp32 masters in
bf16/fp16).

Memory: the files are memory-mapped (``torch.load(mmap=True)``) and read one rank at a time, and
the pages of what was copied are handed back at once (``madvise``, Linux), so the shards never
add up in memory. One torch file (the default) is filled in place: its skeleton is saved without
data, mapped shared, and written rank by rank, its pages released too, so the process holds a
few chunks beyond torch itself. Shards and safetensors are built in memory first: about one fp32
copy of the model.
"""

import argparse
import ctypes
import json
import math
import mmap
import os
import re
import sys

import torch

WRITTEN_BY = "dslaunch (template)"  # the writer puts dslaunch's version here
DEFAULT_SHARD_SIZE = "5GB"  # DeepSpeed's default
COPY_CHUNK = 16 << 20  # bytes copied between two page releases


# -- reading mapped files, and giving their pages back ------------------------------------------

class Mapped:
    """A torch file loaded memory-mapped, and the address ranges of its mapping (from
    /proc/self/maps) so that ``release`` can drop pages of this file and of nothing else."""

    def __init__(self, path, shared=False):
        self.path = path
        if not os.path.isfile(path):
            raise ValueError(f"{path}: checkpoint file not found")
        try:
            if shared:  # writable: what is written into the tensors goes to the file
                with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
                    self.obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            else:
                self.obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # truncated, not a torch file, unsafe pickle...
            raise ValueError(f"{path}: cannot read checkpoint file ({type(e).__name__})") from None
        self.ranges = _mapped_ranges(path)


def _mapped_ranges(path):
    try:
        real = os.path.realpath(path)
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n") == real:
                    a, b = parts[0].split("-")
                    out.append((int(a, 16), int(b, 16)))
        return out
    except OSError:
        return []


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_MADVISE = _madvise()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_DONTNEED = 4


def release(t, mapped):
    """Drop the whole pages under tensor ``t`` (of the file ``mapped``) from this process: pages of
    a file mapping (clean ones of a private mapping, or any of a shared one, whose writes are in
    the file's page cache), so the memory goes back and a later read maps them again."""
    if mapped is None or _MADVISE is None or not mapped.ranges or t.numel() == 0:
        return
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    if not any(a <= start and end <= b for a, b in mapped.ranges):
        return  # not in this file's mapping (a copy): nothing to give back
    lo, hi = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if hi > lo:
        _MADVISE(lo, hi - lo, _MADV_DONTNEED)


def copy_released(dst, src, mapped, dst_mapped=None):
    """``dst.copy_(src)`` for flat tensors, chunk by chunk, releasing ``src``'s pages as it goes
    (``src`` is a tensor of the mapped file ``mapped``), and ``dst``'s when it is a tensor of the
    output file mapped shared (``dst_mapped``)."""
    step = max(1, COPY_CHUNK // max(1, src.element_size()))
    for a in range(0, src.numel(), step):
        piece = src[a: a + step]
        target = dst[a: a + piece.numel()]
        target.copy_(piece)
        release(piece, mapped)
        release(target, dst_mapped)


def fp32_like(saved):
    """An empty output tensor for a saved one: fp32 if floating point, its own dtype otherwise."""
    dtype = torch.float32 if saved.is_floating_point() else saved.dtype
    return torch.empty(saved.shape, dtype=dtype)


def fill(saved, mapped):
    """A saved tensor copied out of its mapped file (floating point ones in fp32)."""
    out = fp32_like(saved)
    copy_released(out.view(-1), saved.reshape(-1), mapped)
    return out


# -- ZeRO 0-3 ----------------------------------------------------------------------------------

def rank_path(path, rank):
    return os.path.join(path, f"rank_{rank}_optim_states.pt")


def shard_pieces(layout, rank):
    """(name, lo, hi, pos) for each piece of a parameter that ``rank`` holds: elements [lo, hi) of
    the flattened parameter sit at ``pos`` in its shard (the rank's chunk of every bucket,
    concatenated: rank k owns elements [k*c, (k+1)*c) of a bucket of c*world elements)."""
    pos = 0
    for bucket in layout["buckets"]:
        c = bucket["numel"] // layout["world_size"]
        c_lo, c_hi = rank * c, (rank + 1) * c
        for name, _shape, start, numel in bucket["params"]:
            lo, hi = max(start, c_lo), min(start + numel, c_hi)
            if lo < hi:
                yield name, lo - start, hi - start, pos + lo - c_lo
        pos += c


EXPERT_FILES = re.compile(r"^layer_\d+_expert_\d+_mp_rank_\d+_model_states\.pt$")


def _sharded_names(path, meta):
    """{name: numel} of every tensor the ZeRO 1-3 shards hold: rank 0's groups, and with MoE the
    expert groups of every rank (each expert-data-parallel group holds its own experts)."""
    sharded = {}
    world = int(meta.get("world_size", 1))
    for rank in range(world):
        f = Mapped(rank_path(path, rank))
        groups = f.obj["strategy"]["zero"]["groups"]
        for group in groups:
            if rank and len(group.get("ranks", range(world))) == world:
                continue
            for bucket in group["layout"]["buckets"]:
                for name, _shape, _start, numel in bucket["params"]:
                    sharded[name] = numel
        del f
        if all(len(g.get("ranks", range(world))) == world for g in groups):
            break  # no experts: every rank's layout is rank 0's
    return sharded


def zero_checkpoint(path, meta, exclude=(), alloc=None):
    """Stream a ZeRO 0-3 checkpoint: buffers and unsharded weights from ``model_states.pt`` (and
    MoE experts from their files), then each rank's fp32 master shard copied into place, one rank
    file mapped at a time. ``alloc``: specs {name: (shape, dtype)} -> (output tensors, the Mapped
    file they live in or None); default: new tensors in memory. Names in ``exclude`` are left
    out."""
    if meta.get("zero_stage") in (1, 2, 3) and autotp_size(meta) > 1:
        return autotp_checkpoint(path, meta, exclude, alloc)
    model = Mapped(os.path.join(path, "model_states.pt"))
    sources = [(model, model.obj["module"])]
    # ZeRO 3: {key: [name in the shards, shape]} of the empty placeholders in "module"
    part = model.obj.get("zero3_partitioned") or {}
    for fname in sorted(os.listdir(path)):
        if EXPERT_FILES.match(fname):
            expert = Mapped(os.path.join(path, fname))
            sources.append((expert, expert.obj))
    sharded = _sharded_names(path, meta) if meta.get("zero_stage") in (1, 2, 3) else {}
    specs = {name: (tuple(part[name][1]) if name in part else tuple(t.shape),
                    torch.float32 if t.is_floating_point() else t.dtype)
             for _, module in sources for name, t in module.items() if name not in exclude}
    out, dst = alloc(specs) if alloc else (
        {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in specs.items()}, None)
    filled = {}
    for mapped, module in sources:
        for name, saved in module.items():
            if name in out and name not in sharded and name not in part:
                copy_released(out[name].view(-1), saved.reshape(-1), mapped, dst)
    del model, sources, module
    for rank in range(int(meta.get("world_size", 1)) if sharded else 0):
        f = Mapped(rank_path(path, rank))
        for group in f.obj["strategy"]["zero"]["groups"]:
            master = group["master"]
            # (an MoE expert group: the rank within its expert-data-parallel group)
            for name, lo, hi, pos in shard_pieces(group["layout"], group.get("rank", rank)):
                if name not in specs and name not in exclude:
                    raise ValueError(f"{f.path}: shard tensor {name!r} is not in model_states.pt")
                if name in out:
                    copy_released(out[name].view(-1)[lo:hi], master[pos: pos + hi - lo], f, dst)
                    filled[name] = filled.get(name, 0) + hi - lo
        del f
    for name in sharded:
        if name in out and (filled.get(name, 0) != sharded[name] or
                            sharded[name] != out[name].numel()):
            raise ValueError(f"{path}: tensor {name!r}: the shards hold {filled.get(name, 0)} of "
                             f"its {out[name].numel()} elements")
    for key, (name, _shape) in part.items():  # a tied weight's other names
        if key in out and key != name:
            if name not in out or name not in sharded:
                raise ValueError(f"{path}: tensor {key!r} names {name!r}, which no shard holds")
            out[key].copy_(out[name])
    return out


def autotp_size(meta):
    return int((meta.get("autotp") or {}).get("tp_size", 1))


def autotp_checkpoint(path, meta, exclude=(), alloc=None):
    """``zero_checkpoint`` of a ZeRO 1-3 checkpoint trained with AutoTP (``tensor_parallel.
    autotp_size``): TP rank t's slices are partitioned over its data ranks (global ranks
    ``d * tp + t``), so each parameter is gathered per TP rank (``Masters``) and its slices put
    back with the row ranges ``metadata.json`` recorded (``autotp.splits``); a parameter no TP
    rank splits is TP rank 0's. At ZeRO 3 ``model_states.pt`` holds placeholders of this-TP-rank
    shape (``zero3_partitioned``), at ZeRO 1-2 the whole weights: in both the masters are what
    is written, the other tensors (buffers, frozen weights) as saved."""
    info = meta["autotp"]
    tp, splits = int(info["tp_size"]), info.get("splits", {})
    world = int(meta.get("world_size", 1))
    if world % tp:
        raise ValueError(f"{path}: world size {world} is not a multiple of the AutoTP size {tp}")
    dp = world // tp
    masters = [Masters(path, lambda d, t=t: d * tp + t) for t in range(tp)]
    model = Mapped(os.path.join(path, "model_states.pt"))
    part = model.obj.get("zero3_partitioned") or {}

    def whole_shape(key, saved):
        if key not in part:  # saved whole (ZeRO 1-2 gathers the split ones on save)
            return tuple(saved.shape)
        name, shape = part[key][0], list(part[key][1])
        split = splits.get(name)
        if split is None:
            return tuple(shape)
        shape[split["dim"]] = split["full"]
        return tuple(reversed(shape)) if split.get("conv1d") else tuple(shape)

    module = {k: v for k, v in model.obj["module"].items() if k not in exclude}
    specs = {k: (whole_shape(k, v), torch.float32 if v.is_floating_point() else v.dtype)
             for k, v in module.items()}
    out, dst = alloc(specs) if alloc else (
        {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in specs.items()}, None)
    for key, saved in module.items():
        name = part[key][0] if key in part else key
        split = splits.get(name)
        values = [masters[t].get(name) for t in range(tp if split else 1)]
        if values[0] is None:
            if key in part:
                raise ValueError(f"{path}: tensor {key!r} ({name!r}) is in none of the ZeRO "
                                 f"shards of the {dp} data rank(s) of TP rank 0")
            copy_released(out[key].view(-1), saved.reshape(-1), model, dst)
            continue
        if split is not None:
            whole = unsplit(values, [dict(split, ranges=split["ranges"][t]) for t in range(tp)])
            value = whole.t() if split.get("conv1d") else whole
        else:
            value = values[0]
        if tuple(value.shape) != tuple(out[key].shape):
            raise ValueError(f"{path}: tensor {key!r} comes out of the shards with shape "
                             f"{list(value.shape)}, the checkpoint's model has "
                             f"{list(out[key].shape)}")
        out[key].copy_(value)
        release(out[key], dst)
    return out


def torch_file_alloc(target):
    """An ``alloc`` for ``zero_checkpoint`` whose tensors are the torch file ``target`` itself:
    its skeleton is saved without data (``torch.serialization.skip_data``: the untouched empty
    tensors are never resident), then loaded mapped shared, so the consolidation writes straight
    into the file and its pages are released as they are written: memory stays far below one
    copy of the model. None where this torch lacks them (the caller builds the state in memory)."""
    ser = torch.serialization
    if not (hasattr(ser, "skip_data")  # torch >= 2.6: both context managers
            and isinstance(getattr(ser, "set_default_mmap_options", None), type)):
        return None

    def alloc(specs):
        skeleton = {n: torch.empty(shape, dtype=dtype) for n, (shape, dtype) in specs.items()}
        with torch.serialization.skip_data():
            torch.save(skeleton, target)
        del skeleton
        out = Mapped(target, shared=True)
        return out.obj, out
    return alloc


# -- pipeline / tensor parallel ----------------------------------------------------------------

class Masters:
    """ZeRO 1-3 fp32 master shards of one data-parallel group, by parameter; ``rank_of(k)``: the
    global rank of data-parallel rank k (files are opened mapped, as they are needed)."""

    def __init__(self, path, rank_of):
        self.path, self.rank_of, self.files, self.where = path, rank_of, {}, {}
        for gi, group in enumerate(self.zero(0)["groups"]):
            layout, pos = group["layout"], 0
            for bucket in layout["buckets"]:
                c = bucket["numel"] // layout["world_size"]
                for name, shape, start, numel in bucket["params"]:
                    self.where[name] = (gi, pos, c, start, numel, shape)
                pos += c

    def zero(self, k):
        rank = self.rank_of(k)
        if rank not in self.files:
            self.files[rank] = Mapped(rank_path(self.path, rank))
        return self.files[rank].obj["strategy"]["zero"]

    def get(self, name):
        if name not in self.where:
            return None
        gi, pos, c, start, numel, shape = self.where[name]
        out = torch.empty(numel, dtype=torch.float32)
        for k in range(start // c, (start + numel - 1) // c + 1):
            lo, hi = max(start, k * c), min(start + numel, (k + 1) * c)
            src = self.zero(k)["groups"][gi]["master"][pos + lo - k * c: pos + hi - k * c]
            copy_released(out[lo - start: hi - start], src, self.files[self.rank_of(k)])
        return out.reshape(shape)


def stage_masters(path, meta, global_rank):
    """name -> fp32 master (or None) of one (pipeline stage, TP rank)."""
    if meta.get("dtype", "fp32") == "fp32":
        return lambda name: None  # the layer files hold the exact fp32 weights
    if not meta.get("zero_stage"):
        strategy = Mapped(rank_path(path, global_rank(0))).obj["strategy"]
        return dict(zip(meta["param_names"], strategy.get("fp32_masters") or [])).get
    return Masters(path, global_rank).get


def rank_of(stage, tp_rank, dp, tp):
    """Data-parallel rank -> global rank at one (stage, TP rank): pipe slowest, model fastest."""
    return lambda d: (stage * dp + d) * tp + tp_rank


def unsplit(pieces, splits):
    """A tensor-parallel parameter from its TP ranks' slices and the row ranges each holds."""
    dim = splits[0]["dim"]
    shape = list(pieces[0].shape)
    shape[dim] = splits[0]["full"]
    out = torch.empty(shape, dtype=pieces[0].dtype)
    for piece, split in zip(pieces, splits):
        pos = 0
        for a, b in split["ranges"]:
            out.narrow(dim, a, b - a).copy_(piece.narrow(dim, pos, b - a))
            pos += b - a
    return out


def pipe_checkpoint(path, meta):
    pipe, tp, dp = meta["pipe"], meta["tp"], meta["dp"]
    out = {}
    for s in range(pipe):
        layers, masters, splits = [], [], []
        for t in range(tp):
            layers.append(Mapped(os.path.join(path, f"layer_stage{s:02d}_tp{t:02d}_model_states.pt")))
            shard = meta.get("shards", {}).get(f"{s}_{t}", {})
            masters.append(stage_masters(path, dict(meta, **shard), rank_of(s, t, dp, tp)))
            splits.append(shard.get("splits", {}))
        for name in layers[0].obj:
            if name in out:
                continue  # a tied layer on several stages: its first owner's copy
            values = []
            for t in range(tp if name in splits[0] else 1):
                master, saved = masters[t](name), layers[t].obj[name]
                values.append(fill(saved, layers[t]) if master is None
                              else master.reshape(saved.shape))
            out[name] = unsplit(values, [sp[name] for sp in splits]) if len(values) > 1 \
                else values[0]
    return out


# -- writing: one file, or shards and their index ----------------------------------------------

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size):
    """Bytes from an int or a string such as ``"5GB"`` (10**9) or ``"500MiB"`` (2**20)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(size).upper())
    if not m or int(float(m.group(1)) * _UNITS[m.group(2) or ""]) <= 0:
        raise ValueError(f"max_shard_size {size!r}: give a positive size such as 5GB, 500MB, "
                         "2GiB or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def nbytes(t):
    return t.numel() * t.element_size()


def plan_shards(state, max_bytes):
    """Names grouped in order into shards of at most ``max_bytes`` (a bigger tensor alone)."""
    shards, size = [[]], 0
    for name, t in state.items():
        if shards[-1] and size + nbytes(t) > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes(t)
    return shards


def _save_one(tensors, path, safe):
    tmp = path + ".part"
    if safe:
        from safetensors.torch import save_file

        save_file(tensors, tmp, metadata={"format": "pt"})
    else:
        torch.save(tensors, tmp)
    os.replace(tmp, path)


def is_dir_output(out, max_shard_size=None):
    return os.path.isdir(out) or out.endswith(os.sep) or max_shard_size is not None


def check_output_options(max_shard_size=None, safe_serialization=False):
    """Raise ValueError now (before any consolidating) for options that cannot be honoured."""
    if safe_serialization:
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            raise ValueError("--safe_serialization needs the safetensors package: pip install "
                             "safetensors (or leave the flag out for a torch file)") from None
    if max_shard_size is not None:
        parse_size(max_shard_size)


def write_output(state, out, max_shard_size=None, safe_serialization=False):
    """Write ``state`` as ``out`` says (see the module docstring); each file under a temporary
    name then renamed, the index last. Returns the path written (a file, or the index)."""
    check_output_options(max_shard_size, safe_serialization)
    out = os.fspath(out)
    if not is_dir_output(out, max_shard_size):
        _save_one(state, out, safe_serialization)
        return out
    os.makedirs(out, exist_ok=True)
    base = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    shards = plan_shards(state, parse_size(max_shard_size or DEFAULT_SHARD_SIZE))
    if len(shards) == 1:
        path = os.path.join(out, base)
        _save_one(state, path, safe_serialization)
        return path
    stem, ext = os.path.splitext(base)
    weight_map = {}
    for i, names in enumerate(shards, 1):
        fname = f"{stem}-{i:05d}-of-{len(shards):05d}{ext}"
        _save_one({n: state[n] for n in names}, os.path.join(out, fname), safe_serialization)
        weight_map.update({n: fname for n in names})
    index = os.path.join(out, base + ".index.json")
    total = sum(nbytes(t) for t in state.values())
    with open(index + ".part", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
        f.write("\n")
    os.replace(index + ".part", index)
    return index


def write_zero_checkpoint(path, meta, out, max_shard_size=None, safe_serialization=False,
                          exclude=()):
    """Consolidate a ZeRO 0-3 checkpoint into ``out`` (``write_output``'s rules). One torch file
    is written in place (``torch_file_alloc``), under a temporary name then renamed; shards and
    safetensors are built in memory first (about one fp32 copy of the model). Returns (path
    written, tensors, bytes)."""
    check_output_options(max_shard_size, safe_serialization)
    out = os.fspath(out)
    target = None
    if not safe_serialization and not is_dir_output(out, max_shard_size):
        target = out
    elif (not safe_serialization and max_shard_size is None and is_dir_output(out)
          and _model_bytes(path, exclude) <= parse_size(DEFAULT_SHARD_SIZE)):
        os.makedirs(out, exist_ok=True)
        target = os.path.join(out, "pytorch_model.bin")  # one file in the directory
    alloc = torch_file_alloc(target + ".part") if target else None
    if alloc is not None:
        try:
            state = zero_checkpoint(path, meta, exclude, alloc)
            count, size = len(state), sum(nbytes(t) for t in state.values())
            del state
            os.replace(target + ".part", target)
            return target, count, size
        finally:
            if os.path.exists(target + ".part"):
                os.remove(target + ".part")
    state = zero_checkpoint(path, meta, exclude)
    written = write_output(state, out, max_shard_size, safe_serialization)
    return written, len(state), sum(nbytes(t) for t in state.values())


def _model_bytes(path, exclude):
    """Bytes of the consolidated output (fp32 for floating point), from the model file's shapes."""
    obj = Mapped(os.path.join(path, "model_states.pt")).obj
    part = obj.get("zero3_partitioned") or {}
    numel = {k: math.prod(shape) for k, (_, shape) in part.items()}
    return sum(numel.get(n, t.numel()) * (4 if t.is_floating_point() else t.element_size())
               for n, t in obj["module"].items() if n not in exclude)


def frozen_of(meta):
    frozen = set(meta.get("frozen_params", []))
    for shard in meta.get("shards", {}).values():
        frozen.update(shard.get("frozen_params", []))
    return frozen


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=f"written by {WRITTEN_BY}")
    p.add_argument("checkpoint_dir")
    p.add_argument("output_dir", help="output directory (see --max_shard_size), or a file")
    p.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: 'latest')")
    p.add_argument("--exclude_frozen_parameters", action="store_true")
    p.add_argument("--safe_serialization", action="store_true",
                   help="write safetensors (needs the safetensors package)")
    p.add_argument("--max_shard_size", default=None,
                   help="shard the output above this size (e.g. 5GB, 500MB; default 5GB); "
                        "OUTPUT is then a directory")
    p.add_argument("-d", "--debug", action="store_true", help="print each tensor written")
    args = p.parse_args(argv)
    try:
        check_output_options(args.max_shard_size, args.safe_serialization)
        tag = args.tag
        if tag is None:
            with open(os.path.join(args.checkpoint_dir, "latest")) as f:
                tag = f.read().strip()
        path = os.path.join(args.checkpoint_dir, tag)
        with open(os.path.join(path, "metadata.json")) as f:
            meta = json.load(f)
        exclude = frozen_of(meta) if args.exclude_frozen_parameters else set()
        if meta.get("format") == "dslaunch-pipe-1":
            state = {k: v for k, v in pipe_checkpoint(path, meta).items() if k not in exclude}
            out = write_output(state, args.output_dir, args.max_shard_size,
                               args.safe_serialization)
            count = len(state)
        else:
            out, count, _ = write_zero_checkpoint(path, meta, args.output_dir,
                                                  args.max_shard_size, args.safe_serialization,
                                                  exclude)
        if args.debug and not args.safe_serialization and not out.endswith(".json"):
            for k, v in torch.load(out, weights_only=True, mmap=True).items():
                print(f"{k}: {list(v.shape)} {str(v.dtype).replace('torch.', '')}")
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        sys.exit(f"zero_to_fp32.py: cannot consolidate {args.checkpoint_dir}: "
                 f"{type(e).__name__}: {e}")
    print(f"wrote {out}: {count} tensors (fp32) from {path}")


if __name__ == "__main__":
    main()
