"""DeepSpeed's *universal checkpoint*, both ways: a folder written by DeepSpeed 0.19's
``ds_to_universal.py`` loads into the engine (any world size, ZeRO 0-3), and
``dslaunch ckpt to-universal`` writes one from a dslaunch (or DeepSpeed) ZeRO 1-3 checkpoint that
DeepSpeed loads with ``checkpoint.load_universal: true``.

The layout, ``<dir>/<tag>/`` (``<dir>/latest_universal`` names the tag):

- ``zero/<param name>/fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``: ``{"param": the whole
  tensor in its own shape, "cat_dim": 0}`` (the fp32 master and each optimizer moment, one
  file per parameter and state: nothing is laid out by rank, which is the point);
  ``step.pt``: the optimizer's step (a 0-dim tensor). Buffers and frozen parameters get an
  ``fp32.pt`` too.
- ``zero/optimizer_state.pt``: the optimizer's ``param_groups`` (hyperparameters) and
  ZeRO's scalars (``ds_version``, ``zero_stage``, ``clip_grad``, loss scaler...).
- ``mp_rank_00_model_states.pt``: DeepSpeed's model-states file (counters, lr scheduler, client
  state at its top level; DeepSpeed takes no weights from it when loading a universal folder).

Reading (``UniversalCheckpoint``) answers the questions ``deepspeed_format.py``'s reader
answers, by parameter name, so ``load_deepspeed_checkpoint`` loads it the same way: every rank
cuts its own shard from the whole tensors. A folder converted from a tensor-parallel run holds
whole (merged) tensors too: an AutoTP job takes its rank's slices of them
(``autotp_states.TPSlicedReader``), at any TP size.
Files are read with ``torch.load(weights_only=True)``; ``optimizer_state.pt`` pickles DeepSpeed's
loss scaler and stage enum, allowed as inert records (``deepspeed_format._SAFE``).

Writing (``to_universal``): a dslaunch ZeRO 1-3 checkpoint's shards are gathered parameter by
parameter (``shard_index.py``), one parameter and state in memory at a time. An AutoTP
checkpoint's TP slices are put back together (whole tensors, ``cat_dim`` the split's dim, none
for the parameters every TP rank holds) and, as DeepSpeed's converter leaves them, one
``mp_rank_<t>_model_states.pt`` per TP rank with its slices and DeepSpeed's AutoTP
``universal_checkpoint_info`` (row-parallel and replicated patterns). The loss scaler and
``clip_grad`` are left out of ``optimizer_state.pt``, so DeepSpeed keeps its own config's.
A pipeline-engine checkpoint is read by ``pipe_universal.PipeShards`` (stages joined, TP slices
merged) and written the same way; a pipeline job loads a universal folder through
``pipe_universal.StageView`` (its own stage's parameters), at any layout.
"""

from __future__ import annotations

import math
import os
import re
import shutil

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.checkpoint.autotp_states import SavedTPRanks, whole_of
from dslaunch.engine.checkpoint.deepspeed_format import DS_KEYS, DeepSpeedCheckpoint, ds_load, is_deepspeed_checkpoint
from dslaunch.engine.storage.files import (
    CheckpointError,
    RankFiles,
    atomic_text,
    dslaunch_version,
    read_meta,
    resolve_tag,
)
from dslaunch.engine.storage.shard_index import ParamIndex

# DeepSpeed's names (deepspeed.checkpoint.constants), the same values
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"
UNIVERSAL_CHECKPOINT_VERSION_KEY = "universal_checkpoint_version"
UNIVERSAL_CHECKPOINT_VERSION_VALUE = 0.4
ORIGINAL_VOCAB_SIZE = "original_vocab_size"
PADDED_VOCAB_SIZE = "padded_vocab_size"
VOCABULARY_PARAMETER_PATTERNS = "vocabulary_parameter_patterns"
PIPELINE_REPLICATED_PARAMETER_PATTERNS = "pipeline_replicated_parameter_patterns"
PARAMETER_TO_AVERAGE_PATTERNS = "parameter_to_average_patterns"
PARAMETER_WITH_ROW_PARALLELISM_PATTERNS = "parameter_with_row_parallelism_patterns"
TP_REPLICATED_PARAMETER_PATTERNS = "tp_replicated_parameter_patterns"
PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0 = "parameter_with_2_sub_params_cat_dim_0"
PARAMETER_WITH_SUB_PARAMS = "parameter_with_sub_params"
AUTOTP_UNSUPPORTED_PARAMETER_PATTERNS = "autotp_unsupported_parameter_patterns"
PARAM = "param"
CAT_DIM = "cat_dim"
PARAM_N_SUB_PARAMS = "param_n_sub_params"
SUB_PARAM_SHAPE = "sub_param_shape"
VOCAB_TENSOR = "vocab_tensor"
FP32_WEIGHT_KEY = "fp32"

LATEST = "latest_universal"
ZERO_DIR = "zero"
OPTIM_STATE = "optimizer_state.pt"
MODEL_FILE = "mp_rank_00_model_states.pt"
MODEL_3_FILE = "zero_pp_rank_0_mp_rank_00_model_states.pt"
# the DeepSpeed release whose universal format (and ds_version check) the writer follows
DS_FORMAT_VERSION = "0.19.8"


def is_universal_checkpoint(path: str) -> bool:
    """Whether ``<dir>/<tag>`` is a universal checkpoint (``zero/optimizer_state.pt``)."""
    return os.path.isfile(os.path.join(path, ZERO_DIR, OPTIM_STATE))


def universal_tag(load_dir: str, prefer: bool) -> str | None:
    """The tag ``load_checkpoint(tag=None)`` takes from ``latest_universal``: when the config
    says ``checkpoint.load_universal`` (DeepSpeed's rule), or when there is no ``latest``."""
    path = os.path.join(load_dir, LATEST)
    if not os.path.isfile(path) or (not prefer and os.path.isfile(
            os.path.join(load_dir, "latest"))):
        return None
    with open(path) as f:
        return f.read().strip() or None


# -- reading -----------------------------------------------------------------------------------

class UniversalCheckpoint:
    """One universal checkpoint read by parameter name, with ``DeepSpeedCheckpoint``'s
    interface (``where``, ``shape``, ``gather``, ``state_keys``, ``scalars``, ``param_groups``,
    ``module_state_dict``, ``client_state``, ``model``, ``model_path``)."""

    def __init__(self, path: str):
        self.path = path
        self.zero = os.path.join(path, ZERO_DIR)
        self.optim = ds_load(os.path.join(self.zero, OPTIM_STATE))
        if not isinstance(self.optim, dict) or "param_groups" not in self.optim:
            raise CheckpointError(f"{os.path.join(self.zero, OPTIM_STATE)}: no 'param_groups': "
                                  "not a universal checkpoint's optimizer state")
        self.model_path = _model_file(path)
        self.model = ds_load(self.model_path)
        if not isinstance(self.model, dict):
            raise CheckpointError(f"{self.model_path}: not a DeepSpeed model-states file")
        self._files: dict = {}
        names = sorted(d for d in _param_dirs(self.zero))
        self.shape = {n: tuple(self._tensor(n, FP32_WEIGHT_KEY).shape) for n in names}
        # every name with fp32 weights; buffers are among them (ds_to_universal writes them too)
        self.where = dict.fromkeys(names)

    def _file(self, name: str, key: str):
        path = os.path.join(self.zero, name, f"{key}.pt")
        if path not in self._files:
            if not os.path.isfile(path):
                return None
            try:
                self._files[path] = torch.load(path, map_location="cpu", weights_only=True,
                                               mmap=True)
            except Exception as e:
                raise CheckpointError(f"{path}: cannot read universal checkpoint file "
                                      f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") \
                    from None
        return self._files[path]

    def _tensor(self, name: str, key: str):
        d = self._file(name, key)
        if d is None:
            return None
        path = os.path.join(self.zero, name, f"{key}.pt")
        if not isinstance(d, dict) or not torch.is_tensor(d.get(PARAM)):
            raise CheckpointError(f"{path}: no '{PARAM}' tensor")
        # a tensor-parallel parameter (cat_dim, sub-parameters, an affine map): ds_to_universal
        # wrote it merged, whole in the model's own layout, which is all this reader takes
        return d[PARAM]

    def _padded(self, name: str, key: str, shape) -> torch.Tensor:
        """The whole tensor, vocabulary padding put back (DeepSpeed strips it: ``vocab_tensor``)
        when ``shape`` (the model's) has more rows."""
        t = self._tensor(name, key)
        if shape is not None and tuple(t.shape) != tuple(shape) and t.dim() == len(shape) \
                and (self._file(name, key) or {}).get(VOCAB_TENSOR) and t.shape[0] < shape[0]:
            t = torch.nn.functional.pad(t, (0, 0, 0, shape[0] - t.shape[0]))
        return t

    def set_model_shapes(self, shapes: dict) -> None:
        """The model's shapes (vocabulary rows padded beyond the checkpoint's)."""
        for n, s in shapes.items():
            if n in self.shape and self.shape[n] != tuple(s) and (
                    self._file(n, FP32_WEIGHT_KEY) or {}).get(VOCAB_TENSOR):
                self.shape[n] = tuple(s)

    def gather(self, key, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        hi = math.prod(self.shape[name]) if hi is None else hi
        t = self._padded(name, key or FP32_WEIGHT_KEY, self.shape[name])
        if t is None:  # no optimizer state (never stepped): zeros, as a fresh optimizer has
            return torch.zeros(hi - lo, dtype=torch.float32)
        return t.reshape(-1)[lo:hi].float()

    def full(self, name: str) -> torch.Tensor:
        return self.gather(None, name).view(self.shape[name])

    def state_keys(self) -> list:
        keys = set()
        for name in self.where:
            keys.update(f[:-3] for f in os.listdir(os.path.join(self.zero, name))
                        if f.endswith(".pt"))
        return sorted(keys - {FP32_WEIGHT_KEY, "step"})

    def scalars(self) -> dict:
        """``step`` (the same for every parameter of a group, as DeepSpeed checks); from the
        optimizer state's first group where no parameter has a ``step.pt`` (ZeRO 3's layout)."""
        step = None
        for name in self.where:
            path = os.path.join(self.zero, name, "step.pt")
            if os.path.isfile(path):
                step = torch.load(path, map_location="cpu", weights_only=True)
                break
        else:
            state = (self.optim.get("optimizer_state_dict") or {}).get("state") or {}
            step = (state.get(0) or {}).get("step") if isinstance(state, dict) else None
        if step is None:
            return {}
        return {"step": step.clone() if torch.is_tensor(step) else torch.tensor(step)}

    def param_groups(self) -> list:
        return self.optim.get("param_groups", [])

    def module_state_dict(self) -> dict:
        """fp32 weights of every parameter; buffers as ``module`` holds them (their dtype)."""
        module = self.model.get("module") or {}
        buffers = set(self.model.get("buffer_names") or [])
        sd = {n: (module[n].clone() if n in buffers and n in module else self.full(n))
              for n in self.where}
        for name, src in (self.model.get("shared_params") or {}).items():
            if src in sd:
                sd[name] = sd[src]
        return sd

    def client_state(self) -> dict:
        return {k: v for k, v in self.model.items()
                if k not in DS_KEYS and k != UNIVERSAL_CHECKPOINT_INFO}


def _param_dirs(zero: str):
    for d in os.listdir(zero):
        if os.path.isfile(os.path.join(zero, d, f"{FP32_WEIGHT_KEY}.pt")):
            yield d


def _model_file(path: str) -> str:
    for name in (MODEL_FILE, MODEL_3_FILE):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    found = sorted(n for n in os.listdir(path) if n.endswith("_model_states.pt"))
    if not found:
        raise CheckpointError(f"{path}: no *_model_states.pt in the universal checkpoint")
    return os.path.join(path, found[0])


def load_universal_checkpoint(engine, path: str, strict=True, load_optimizer_states=True,
                              load_lr_scheduler_states=True, load_module_only=False):
    """``engine.load_checkpoint`` of a universal checkpoint ``<dir>/<tag>``: ZeRO 1-3 engines
    through ``deepspeed_format.load_deepspeed_checkpoint`` (each rank cuts its shard), stage 0
    here (every rank holds the whole state)."""
    from dslaunch.engine.checkpoint.autotp_states import TPSlicedReader, whole_shapes
    from dslaunch.engine.checkpoint.deepspeed_format import load_deepspeed_checkpoint

    uc = UniversalCheckpoint(path)
    shapes = whole_shapes(engine.module)
    uc.set_model_shapes(shapes)
    if hasattr(engine.module, "tied_modules"):  # a pipeline stage: its own tensors only
        from dslaunch.engine.checkpoint.pipe_universal import StageView
        uc = StageView(uc, engine.module, shapes)
    if any(getattr(p, "tensor_model_parallel", False) and hasattr(p, "tp_ranges")
           for p in engine.module.parameters()):  # AutoTP or mpu TP: this rank's slices
        uc = TPSlicedReader(uc, engine.module)
    stage0 = engine.zero_stage == 0 and load_optimizer_states and not load_module_only
    loaded = load_deepspeed_checkpoint(engine, path, strict, load_optimizer_states and not stage0,
                                       load_lr_scheduler_states, load_module_only, reader=uc)
    if stage0 and engine.optimizer is not None:
        _load_stage0(engine, uc)
    return loaded


def _load_stage0(engine, uc) -> None:
    """Stage 0: the optimizer steps whole tensors (its fp32 masters under bf16/fp16)."""
    from dslaunch.engine.storage.zero_shards import scalar_state

    strategy = engine.strategy
    masters = getattr(strategy, "masters", None)
    opt = strategy.optimizer
    keys, scalars = uc.state_keys(), uc.scalars()
    with torch.no_grad():
        for name, p in engine.module.named_parameters():
            if not p.requires_grad or name not in uc.where:
                continue
            target = masters[p] if masters is not None else p
            target.copy_(uc.full(name).to(target.dtype))
            if masters is not None:
                p.copy_(target)
            st = {k: uc.gather(k, name).view_as(target).to(target.device).clone() for k in keys}
            st.update({k: scalar_state(opt, k, v, target.device) for k, v in scalars.items()})
            opt.state[target] = st
    for pg, hyper in zip(opt.param_groups, uc.param_groups()):
        pg.update({k: v for k, v in hyper.items() if k in pg and k != "params"})


# -- writing -----------------------------------------------------------------------------------

class _DslaunchShards:
    """A dslaunch ZeRO 1-3 checkpoint read by parameter (the source of ``to_universal``)."""

    def __init__(self, path: str):
        from dslaunch.engine.storage.files import load_file, model_file
        from dslaunch.engine.storage.zero_shards import old_index

        self.path = path
        self.meta = meta = read_meta(path)
        if meta.get("expert_parallel"):
            raise CheckpointError(f"{path}: an MoE checkpoint; universal conversion of expert "
                                  "parameters is not supported")
        self.stage, self.world = int(meta.get("zero_stage") or 0), int(meta["world_size"])
        if self.stage not in (1, 2, 3):
            raise CheckpointError(f"{path}: ZeRO stage {self.stage}; DeepSpeed loads universal "
                                  "checkpoints into ZeRO 1-3 engines: save with ZeRO 1-3 "
                                  "(load_checkpoint reshards to any stage 1-3)")
        self.files = RankFiles(path, self.world)
        self.model = load_file(model_file(path), mmap=True)
        z0 = self.files.zero(0)
        # AutoTP: each TP rank's slices are partitioned over its data ranks; put back together
        tp_info = meta.get("autotp") or {}
        self.tp = int(tp_info.get("tp_size", 1))
        self.splits = tp_info.get("splits", {}) if self.tp > 1 else {}
        self.tp_ranks = SavedTPRanks(path, meta, self.tp) if self.tp > 1 else None
        self.groups = []  # per optimizer group: [(name, shape)], {name: (index, ranks)}, state
        for gi, g in enumerate(z0["groups"]):
            if self.tp > 1:  # the group's names from TP rank 0's layout (every TP rank's alike)
                index = ParamIndex(P.Layout.from_meta(g["layout"]))
                names = [(n, self._whole_shape(n, tuple(index.where[n][1].shape)))
                         for n in index.names()]
                self.groups.append((names, None, sorted(g["state"]), dict(g["scalars"])))
                continue
            where = old_index(self.files, gi, self.world)
            names = [(n, tuple(where[n][0].where[n][1].shape)) for n in where]
            self.groups.append((names, where, sorted(g["state"]), dict(g["scalars"])))
        self.hyper = self.files.raw(0)["strategy"].get("param_groups", [])
        self.frozen = set(meta.get("frozen_params") or [])

    def _whole_shape(self, name: str, local: tuple) -> tuple:
        split = self.splits.get(name)
        if split is None:
            return local
        shape = list(local)
        shape[split["dim"]] = split["full"]
        return tuple(reversed(shape)) if split.get("conv1d") else tuple(shape)

    def cat_dim(self, name: str):
        """The dim DeepSpeed's universal files name for a TP-split parameter (in the model's
        layout); None for one every TP rank holds whole."""
        split = self.splits.get(name)
        if split is None:
            return None
        return 1 - split["dim"] if split.get("conv1d") else split["dim"]

    def gather(self, gi: int, key, name: str) -> torch.Tensor:
        if self.tp > 1:  # every TP rank's values, its slices put back together
            parts = [self.tp_ranks.values(t, name, key) for t in range(self.tp)]
            full = whole_of(parts, name, self.splits)
            if self.splits.get(name, {}).get("conv1d"):
                full = full.t()
            return full.contiguous().float()
        _, where, _, _ = self.groups[gi]
        index, ranks = where[name]

        def shard(k):
            g = self.files.zero(ranks[k])["groups"][gi]
            return g["master"] if key is None else g["state"][key]
        return index.gather(shard, name).float()

    def module_state_dict(self) -> dict:
        if self.stage == 3:
            from dslaunch.engine.checkpoint.zero3_module import PARTITIONED, full_module_state

            part = self.model.get(PARTITIONED) or {}
            if part:
                return full_module_state(self.path, self.meta, self.model["module"], part)
        return self.model["module"]


def _save(obj, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path)


def to_universal(ckpt_dir: str, out_dir: str, tag=None, out_tag=None) -> str:
    """Write ``<out_dir>/<out_tag>/`` (default ``<tag>_universal``) and
    ``<out_dir>/latest_universal`` from a dslaunch ZeRO 1-3 checkpoint (or a DeepSpeed one);
    returns the folder written. Written under a temporary name and renamed: nothing is
    half-written. Returns ``(folder, {"params", "others", "stage", "world_size"})``."""
    ckpt_dir = os.fspath(ckpt_dir)
    tag = resolve_tag(ckpt_dir, tag)
    path = os.path.join(ckpt_dir, tag)
    out_tag = out_tag or f"{tag}_universal"
    dst = os.path.join(out_dir, out_tag)
    tmp = os.path.join(out_dir, f".{out_tag}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        if is_deepspeed_checkpoint(path):
            info = _write_from_deepspeed(path, tmp)
        else:
            info = _write_from_dslaunch(path, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    atomic_text(os.path.join(out_dir, LATEST), out_tag)
    return dst, info


def _write_param(zero: str, name: str, shape, states: dict, step, cat_dim=0) -> None:
    """``cat_dim``: None for a parameter every TP rank holds whole (DeepSpeed's replicated
    entries carry none)."""
    for key, t in states.items():
        _save({PARAM: t.reshape(shape).contiguous(),
               **({CAT_DIM: cat_dim} if cat_dim is not None else {})},
              os.path.join(zero, name, f"{key}.pt"))
    if step is not None:
        _save(step, os.path.join(zero, name, "step.pt"))


def _step_tensor(scalars: dict):
    """The step as DeepSpeed's torch optimizers keep it: a 0-dim float32 tensor."""
    v = scalars.get("step")
    if v is None:
        return None
    return (v if torch.is_tensor(v) else torch.tensor(v)).detach().to(torch.float32).reshape(())


def _write_from_dslaunch(path: str, tmp: str) -> dict:
    """A dslaunch ZeRO 1-3 / AutoTP checkpoint, or a pipeline-engine one (``PipeShards``:
    stages joined, TP slices merged)."""
    from dslaunch.engine.checkpoint.pipe_universal import FORMAT as PIPE_FORMAT
    from dslaunch.engine.checkpoint.pipe_universal import PipeShards

    meta = read_meta(path)
    src = PipeShards(path, meta) if meta.get("format") == PIPE_FORMAT else _DslaunchShards(path)
    zero = os.path.join(tmp, ZERO_DIR)
    trained, shapes = set(), []
    for gi, (names, _, keys, scalars) in enumerate(src.groups):
        step = _step_tensor(scalars)
        for name, shape in names:
            states = {FP32_WEIGHT_KEY: src.gather(gi, None, name)}
            states.update({k: src.gather(gi, k, name) for k in keys})
            _write_param(zero, name, shape, states, step,
                         src.cat_dim(name) if src.tp > 1 else 0)
            trained.add(name)
        shapes.append({n: torch.Size(s) for n, s in names})
    module = src.module_state_dict()
    for name, t in module.items():  # buffers and frozen parameters: their weights only
        if name not in trained:
            _save({PARAM: t.detach().float().clone()},
                  os.path.join(zero, name, f"{FP32_WEIGHT_KEY}.pt"))
    m = src.model
    buffers = [n for n in module if n not in trained and n not in src.frozen]
    groups = [dict(h, params=list(range(len(s)))) for h, s in zip(src.hyper, shapes)]
    step = _step_tensor(src.groups[0][3]) if src.groups else None
    optim = {"param_groups": groups, "zero_stage": src.stage,
             "partition_count": [src.world] * len(shapes), "ds_version": DS_FORMAT_VERSION,
             "dslaunch_version": dslaunch_version(),
             # where a DeepSpeed ZeRO 3 engine reads the step and hyperparameters
             "optimizer_state_dict": {"state": {0: {"step": step}} if step is not None else {},
                                      "param_groups": groups}}
    _save(optim, os.path.join(zero, OPTIM_STATE))
    client = m.get("client_state") or {}
    states = {
        **client,
        "module": {n: t.detach().clone() for n, t in module.items()},
        "buffer_names": buffers,
        "optimizer": None,
        "param_shapes": shapes,
        "frozen_param_shapes": {n: module[n].shape for n in module if n in src.frozen},
        "shared_params": {},
        "frozen_param_fragments": {},
        "lr_scheduler": m.get("lr_scheduler"),
        "data_sampler": None,
        "random_ltd": None,
        "skipped_steps": int(m.get("skipped_steps", 0)),
        "global_steps": int(m["global_steps"]),
        "global_samples": int(m["global_samples"]),
        "dp_world_size": src.world,
        "mp_world_size": 1,
        "ds_version": DS_FORMAT_VERSION,
        UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY:
                                    UNIVERSAL_CHECKPOINT_VERSION_VALUE},
    }
    info = {"params": len(trained), "others": len(module) - len(trained), "stage": src.stage,
            "world_size": src.world, "tp_size": src.tp, "pipe": getattr(src, "pipe", 1)}
    if src.tp > 1:
        _write_tp_model_files(src, states, tmp)
        return info
    _save(states, os.path.join(tmp, MODEL_FILE))
    # the name a DeepSpeed ZeRO 3 engine looks for (the same content)
    shutil.copyfile(os.path.join(tmp, MODEL_FILE), os.path.join(tmp, MODEL_3_FILE))
    return info


def _tp_universal_info(src: _DslaunchShards, names) -> dict:
    """The ``universal_checkpoint_info`` DeepSpeed's AutoTP records in its model-states files
    (what its ds_to_universal.py reads to merge the slices): row-parallel weights (cat dim 1),
    the parameters every TP rank holds whole."""
    def pattern(n):
        return rf"^{re.escape(n)}$"
    return {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: sorted(
                pattern(n) for n in names if src.cat_dim(n) == 1),
            TP_REPLICATED_PARAMETER_PATTERNS: sorted(
                pattern(n) for n in names if src.cat_dim(n) is None),
            VOCABULARY_PARAMETER_PATTERNS: [], PARAMETER_WITH_SUB_PARAMS: [],
            AUTOTP_UNSUPPORTED_PARAMETER_PATTERNS: {}}


def _write_tp_model_files(src: _DslaunchShards, states: dict, tmp: str) -> None:
    """DeepSpeed's AutoTP layout: one ``mp_rank_<t>_model_states.pt`` per TP rank, holding that
    rank's slices of the weights and their shapes (ds_to_universal.py copies them as they are;
    a universal load takes no weights from them)."""
    from dslaunch.engine.checkpoint.autotp_states import rank_slice

    module = states["module"]
    for t in range(src.tp):
        def mine(n, v, t=t):
            split = src.splits.get(n)
            if split is None:
                return v
            held = v.t() if split.get("conv1d") else v
            cut = rank_slice(held, split, t)
            return cut.t().contiguous() if split.get("conv1d") else cut
        sliced = {n: mine(n, v) for n, v in module.items()}
        shapes = [{n: sliced[n].shape if n in sliced else torch.Size(s)
                   for n, s in group.items()} for group in states["param_shapes"]]
        _save(dict(states, module=sliced, param_shapes=shapes, mp_world_size=src.tp,
                   dp_world_size=src.world // src.tp,
                   **{UNIVERSAL_CHECKPOINT_INFO: _tp_universal_info(src, list(module))}),
              os.path.join(tmp, f"mp_rank_{t:02d}_model_states.pt"))


def _write_from_deepspeed(path: str, tmp: str) -> dict:
    """A DeepSpeed ZeRO 1-3 checkpoint, as ``ds_to_universal.py`` would write it (without
    DeepSpeed installed)."""
    ds = DeepSpeedCheckpoint(path)
    zero = os.path.join(tmp, ZERO_DIR)
    keys, step = ds.state_keys(), _step_tensor(ds.scalars())
    for name, shape in ds.shape.items():
        states = {FP32_WEIGHT_KEY: ds.gather(None, name)}
        states.update({k: ds.gather(k, name) for k in keys})
        _write_param(zero, name, shape, states, step)
    module = ds.module_state_dict()
    for name, t in module.items():
        if name not in ds.shape:
            _save({PARAM: t.detach().float().clone()},
                  os.path.join(zero, name, f"{FP32_WEIGHT_KEY}.pt"))
    osd = ds.optim[0]["optimizer_state_dict"]
    optim = {k: v for k, v in osd.items() if k not in (
        "base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups",
        "fp32_flat_groups", "optimizer_state_dict")}
    optim["zero_stage"] = ds.stage
    optim["param_groups"] = ds.param_groups()
    optim = {k: v for k, v in optim.items() if type(v).__module__ == "builtins"}
    optim.setdefault("ds_version", DS_FORMAT_VERSION)
    _save(optim, os.path.join(zero, OPTIM_STATE))
    shutil.copyfile(ds.model_path, os.path.join(tmp, MODEL_FILE))
    return {"params": len(ds.shape), "others": len(module) - len(ds.shape), "stage": ds.stage,
            "world_size": ds.world}
