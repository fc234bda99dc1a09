"""Reading DeepSpeed's own ZeRO 1-3 checkpoints (as DeepSpeed 0.19 writes them), so that a run
can move over to dslaunch mid-training: ``engine.load_checkpoint(dir)`` on a DeepSpeed folder
loads the weights, the optimizer states (ZeRO 1-3 engines), the step counters and the lr
scheduler; at any world size, since pieces are matched by parameter name.

DeepSpeed's layout, ``<dir>/<tag>/`` (pipeline and tensor parallel ones are refused):

- ``mp_rank_00_model_states.pt`` (stage 1-2; stage 3: ``zero_pp_rank_{r}_mp_rank_00_model_states
  .pt``, one per rank, weights empty): ``module`` (stage 1-2 weights in the training dtype;
  buffers always), ``param_shapes`` (per optimizer group, name -> shape, in flat order),
  ``shared_params``, ``frozen_param_shapes`` / ``frozen_param_fragments``, ``global_steps``,
  ``global_samples``, ``skipped_steps``, ``lr_scheduler``, and the user's client state.
- ``zero_pp_rank_{r}_mp_rank_00_optim_states.pt``: ``optimizer_state_dict`` with the rank's
  fp32 partition of every group and the base optimizer's state over it (``exp_avg``... as flat
  tensors of the same size, ``step``). Stage 1-2: ``single_partition_of_fp32_groups`` and
  ``base_optimizer_state``, each parameter's place in the partition in ``param_slice_mappings``
  (name -> (numel, start)). Stage 3: ``fp32_flat_groups`` and ``optimizer_state_dict``; each
  parameter split in ``ceil(numel / world)`` elements per rank, in ``param_shapes`` order, the
  ranks' flat groups read as one stream.

The files pickle a few DeepSpeed classes (loss scaler, ZeRO stage enum, fragment address); they
are read with ``torch.load(weights_only=True)`` all the same, each such class allowed under its
DeepSpeed name as an inert record of its attributes (nothing of DeepSpeed is imported or run).
"""

from __future__ import annotations

import glob
import math
import os
import re

import torch

from dslaunch.engine.features.random_ltd.convert import with_random_ltd_names
from dslaunch.engine.storage.files import CheckpointError

MODEL_12 = "mp_rank_00_model_states.pt"
MODEL_3 = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"
# model-states keys that are DeepSpeed's own; the rest is the user's client_state
DS_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
           "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
           "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
           "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
           "checkpoint_parallel_dimensions", "ds_autoep_layers"}


class _Record:
    """A DeepSpeed object read back as the attributes it pickled, nothing more."""

    def __repr__(self):
        return f"{type(self).__name__}({vars(self)})"


class LossScaler(_Record):
    pass


class DynamicLossScaler(_Record):
    pass


class fragment_address(_Record):  # DeepSpeed's spelling, shown in errors
    pass


def _zero_stage(value):
    """``ZeroStageEnum(value)`` read back as the int it holds."""
    return int(value)


_SAFE = [(LossScaler, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
         (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
         (fragment_address, "deepspeed.utils.tensor_fragment.fragment_address"),
         (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum")]


def ds_load(path: str):
    """A DeepSpeed checkpoint file, mapped, ``weights_only`` with DeepSpeed's records allowed."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: DeepSpeed checkpoint file not found")
    try:
        with torch.serialization.safe_globals(_SAFE):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        first = str(e).splitlines()
        hint = next((ln.strip() for ln in first if "Unsupported global" in ln), first[0] if first
                    else "")
        raise CheckpointError(f"{path}: cannot read DeepSpeed checkpoint file "
                              f"({type(e).__name__}: {hint[:300]})") from None


def is_deepspeed_checkpoint(path: str) -> bool:
    """Whether ``<dir>/<tag>`` holds a DeepSpeed checkpoint (and not a dslaunch one)."""
    if os.path.isfile(os.path.join(path, "metadata.json")):
        return False
    return (os.path.isfile(os.path.join(path, MODEL_12))
            or os.path.isfile(os.path.join(path, MODEL_3.format(0)))
            or bool(glob.glob(os.path.join(path, "*zero_pp_rank_*_optim_states.pt"))))


class DeepSpeedCheckpoint:
    """One DeepSpeed ZeRO 1-3 checkpoint, read by parameter name: ``full(name)``, ``gather(key,
    name, lo, hi)`` (key None: the fp32 master; else an optimizer state such as ``exp_avg``)."""

    def __init__(self, path: str):
        self.path = path
        self._check_supported()
        self.optim = self._optim_files()
        self.world = len(self.optim)
        osd0 = self.optim[0]["optimizer_state_dict"]
        self.stage = int(osd0.get("zero_stage", 0))
        if self.stage not in (1, 2, 3):
            raise CheckpointError(f"{self._optim_path(0)}: ZeRO stage {self.stage}; only "
                                  "DeepSpeed ZeRO 1-3 checkpoints are read")
        counts = osd0.get("partition_count")
        count = max(counts) if isinstance(counts, list) else counts
        if count is not None and int(count) != self.world:
            raise CheckpointError(f"{self.path}: written by {count} ranks but "
                                  f"{self.world} optimizer files are there")
        model_path = os.path.join(path, MODEL_3.format(0) if self.stage == 3 else MODEL_12)
        self.model_path = model_path
        self.model = ds_load(model_path)
        if not isinstance(self.model, dict) or "param_shapes" not in self.model:
            raise CheckpointError(f"{model_path}: not a DeepSpeed ZeRO model-states file (no "
                                  "'param_shapes')")
        self.shapes = [dict(g) for g in self.model["param_shapes"]]
        self.shape = {n: tuple(s) for g in self.shapes for n, s in g.items()}
        self.where: dict = {}  # name -> [(rank, group, pos in the rank's flat group, lo, hi)]
        (self._index_3 if self.stage == 3 else self._index_12)()

    # -- files -------------------------------------------------------------------------------
    def _optim_path(self, r: int) -> str:
        return os.path.join(self.path, OPTIM.format(r))

    def _check_supported(self) -> None:
        names = os.listdir(self.path)
        if any(n.startswith("layer_") for n in names) or any(
                re.match(r".*mp_rank_0*[1-9]", n) for n in names):
            raise CheckpointError(f"{self.path}: a DeepSpeed pipeline / tensor-parallel "
                                  "checkpoint; only ZeRO 1-3 data-parallel ones are read")
        if any(n.startswith("bf16_zero_pp_rank_") for n in names):
            raise CheckpointError(f"{self.path}: written by DeepSpeed's BF16_Optimizer "
                                  "(bf16_zero_pp_rank_* files), whose layout is not read yet; "
                                  "consolidate it with DeepSpeed's zero_to_fp32.py and load "
                                  "the weights")

    def _optim_files(self) -> list:
        ranks = sorted(int(m.group(1)) for n in os.listdir(self.path)
                       if (m := re.fullmatch(r"zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt", n)))
        if not ranks:
            raise CheckpointError(f"{self.path}: no zero_pp_rank_*_mp_rank_00_optim_states.pt: "
                                  "not a DeepSpeed ZeRO checkpoint")
        if ranks != list(range(len(ranks))):
            missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
            raise CheckpointError(f"{self._optim_path(missing[0])}: missing (the checkpoint has "
                                  f"ranks {ranks})")
        files = []
        for r in ranks:
            sd = ds_load(self._optim_path(r))
            if not isinstance(sd, dict) or "optimizer_state_dict" not in sd:
                raise CheckpointError(f"{self._optim_path(r)}: no 'optimizer_state_dict'")
            files.append(sd)
        return files

    def _flat(self, r: int, gi: int, key):
        osd = self.optim[r]["optimizer_state_dict"]
        if key is None:
            groups = osd["fp32_flat_groups" if self.stage == 3 else
                         "single_partition_of_fp32_groups"]
            return groups[gi]
        base = osd["optimizer_state_dict" if self.stage == 3 else "base_optimizer_state"]
        return base["state"][gi][key]

    # -- where each parameter's elements are -------------------------------------------------
    def _index_12(self) -> None:
        for r in range(self.world):
            osd = self.optim[r]["optimizer_state_dict"]
            for gi, mapping in enumerate(osd["param_slice_mappings"]):
                for name, frag in mapping.items():
                    done = sum(hi - lo for *_, lo, hi in self.where.get(name, []))
                    numel = int(frag.numel)
                    self.where.setdefault(name, []).append(
                        (r, gi, int(frag.start), done, done + numel))
        self._check_complete()

    def _index_3(self) -> None:
        sizes = [int(t.numel()) for t in self.optim[0]["optimizer_state_dict"]["fp32_flat_groups"]]
        offset = 0  # in the concatenation of a rank's flat groups
        for name, shape in ((n, s) for g in self.shapes for n, s in g.items()):
            numel = math.prod(shape)
            part = -(-numel // self.world)
            for r in range(self.world):
                lo, hi = min(r * part, numel), min((r + 1) * part, numel)
                pos = offset
                while lo < hi:  # split where a flat group ends
                    gi, start = self._group_at(sizes, pos)
                    n = min(hi - lo, sizes[gi] - start)
                    self.where.setdefault(name, []).append((r, gi, start, lo, lo + n))
                    lo, pos = lo + n, pos + n
            offset += part
        if offset > sum(sizes):
            raise CheckpointError(f"{self._optim_path(0)}: the parameters need {offset} elements "
                                  f"per rank but the flat groups hold {sum(sizes)}")
        self._check_complete()

    @staticmethod
    def _group_at(sizes, pos):
        for gi, n in enumerate(sizes):
            if pos < n:
                return gi, pos
            pos -= n
        raise CheckpointError("DeepSpeed flat groups end before the parameters do")

    def _check_complete(self) -> None:
        for name, shape in self.shape.items():
            have = sum(hi - lo for *_, lo, hi in self.where.get(name, []))
            if have != math.prod(shape):
                raise CheckpointError(f"{self.path}: parameter {name!r} has {have} of its "
                                      f"{math.prod(shape)} elements in the optimizer files")

    # -- values ------------------------------------------------------------------------------
    def gather(self, key, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of parameter ``name`` (flattened): its fp32 master (key None) or an
        optimizer state."""
        hi = math.prod(self.shape[name]) if hi is None else hi
        out = torch.empty(hi - lo, dtype=torch.float32)
        for r, gi, start, a, b in self.where[name]:
            x, y = max(a, lo), min(b, hi)
            if x < y:
                out[x - lo: y - lo].copy_(self._flat(r, gi, key)[start + x - a: start + y - a])
        return out

    def full(self, name: str) -> torch.Tensor:
        return self.gather(None, name).view(self.shape[name])

    def state_keys(self) -> list:
        """The optimizer's per-element states (flat tensors), e.g. ``exp_avg``, ``exp_avg_sq``."""
        st = self._base(0)["state"]
        first = st[min(st)] if st else {}
        return [k for k, v in first.items() if torch.is_tensor(v) and v.dim() == 1]

    def scalars(self) -> dict:
        """Per-group scalar states (``step``) as tensors, from the first group of rank 0."""
        st = self._base(0)["state"]
        first = st[min(st)] if st else {}
        return {k: (v.clone() if torch.is_tensor(v) else torch.tensor(v))
                for k, v in first.items() if not (torch.is_tensor(v) and v.dim() == 1)}

    def param_groups(self) -> list:
        return self._base(0).get("param_groups", [])

    def _base(self, r: int) -> dict:
        osd = self.optim[r]["optimizer_state_dict"]
        return osd["optimizer_state_dict" if self.stage == 3 else "base_optimizer_state"]

    def module_state_dict(self) -> dict:
        """The whole model in fp32 where DeepSpeed kept fp32 masters: trainable parameters from
        the optimizer files, frozen ones from their fragments, buffers from ``module``; shared
        (tied) names point at their source's values."""
        sd = {}
        module = self.model.get("module") or {}
        for name in self.model.get("buffer_names") or []:
            if name in module:
                sd[name] = module[name].clone()
        for name in self.shape:
            sd[name] = self.full(name)
        frozen = self.model.get("frozen_param_shapes") or {}
        for name, shape in frozen.items():
            numel = math.prod(shape)
            if self.stage == 3:
                frags = [ds_load(os.path.join(self.path, MODEL_3.format(r)))[
                    "frozen_param_fragments"][name] for r in range(self.world)]
                sd[name] = torch.cat([f.reshape(-1) for f in frags])[:numel].view(tuple(shape))
            else:
                sd[name] = module[name].clone()
        for name, src in (self.model.get("shared_params") or {}).items():
            if src in sd:
                sd[name] = sd[src]
        return sd

    def client_state(self) -> dict:
        return {k: v for k, v in self.model.items() if k not in DS_KEYS}


def load_deepspeed_checkpoint(engine, path: str, strict=True, load_optimizer_states=True,
                              load_lr_scheduler_states=True, load_module_only=False, reader=None):
    """``engine.load_checkpoint`` of a DeepSpeed ZeRO 1-3 checkpoint directory ``path``
    (``<dir>/<tag>``); returns ``(path, client_state)`` as DeepSpeed does. ``reader``: another
    reader with ``DeepSpeedCheckpoint``'s interface (a universal checkpoint: ``universal.py``)."""
    from dslaunch.engine.storage.module_state import check_module

    ds = reader if reader is not None else DeepSpeedCheckpoint(path)
    # random-LTD: DeepSpeed saves the names without the wrappers
    module_sd = with_random_ltd_names(ds.module_state_dict(), engine.module)
    check_module(module_sd, engine.module, ds.model_path, strict)
    engine.strategy.load_module_state_dict(module_sd, strict=strict)
    engine.strategy.sync_from_model()
    if load_module_only:
        return path, ds.client_state()
    if load_optimizer_states and engine.optimizer is not None:
        _load_optimizer(engine, ds)
    sched = engine.lr_scheduler
    if load_lr_scheduler_states and sched is not None and ds.model.get("lr_scheduler"):
        try:
            sched.load_state_dict(ds.model["lr_scheduler"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{ds.model_path}: lr_scheduler state does not fit this "
                                  f"job's scheduler ({e}); load with "
                                  "load_lr_scheduler_states=False") from None
    engine._load_random_ltd_state(ds.model.get("random_ltd"))
    engine.global_steps = int(ds.model.get("global_steps", 0))
    engine.global_samples = int(ds.model.get("global_samples", 0))
    engine.skipped_steps = int(ds.model.get("skipped_steps", 0))
    engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
    engine.strategy.zero_grad()
    return path, ds.client_state()


def _load_optimizer(engine, ds: DeepSpeedCheckpoint) -> None:
    """Each rank builds its own shards (dslaunch's layout) from DeepSpeed's, by name."""
    from dslaunch.engine.storage.zero_shards import load_group

    strategy = engine.strategy
    if engine.zero_stage not in (1, 2, 3) or not hasattr(strategy, "groups"):
        raise CheckpointError(f"{ds.path}: DeepSpeed optimizer states load into a ZeRO 1-3 "
                              f"engine (this one is stage {engine.zero_stage}); load with "
                              "load_optimizer_states=False for the weights alone")
    keys, scalars = ds.state_keys(), ds.scalars()
    for g in strategy.groups:
        master = torch.zeros(g.layout.shard_numel, dtype=torch.float32)
        state = {k: torch.zeros(g.layout.shard_numel, dtype=torch.float32) for k in keys}
        for _, s, lo, hi, pos in g.layout.shard_pieces(strategy.rank):
            if s.name not in ds.where:
                raise CheckpointError(f"{ds.path}: model parameter {s.name!r} is not among the "
                                      "checkpoint's trained parameters")
            master[pos: pos + hi - lo] = ds.gather(None, s.name, lo, hi)
            for k in keys:
                state[k][pos: pos + hi - lo] = ds.gather(k, s.name, lo, hi)
        load_group(strategy, g, master, state, scalars, own=True)
    saved = ds.param_groups()
    for pg, hyper in zip(strategy.optimizer.param_groups, saved):
        pg.update({k: v for k, v in hyper.items() if k in pg and k != "params"})
    strategy._all_gather_params()
