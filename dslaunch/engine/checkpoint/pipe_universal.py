"""Universal checkpoints of the pipeline engine, both ways: ``dslaunch ckpt to-universal`` of a
pipeline / tensor-parallel checkpoint (``pipeline.py``, format ``dslaunch-pipe-1``), and a
universal folder (``universal.py``'s layout, ours or DeepSpeed's) loaded into a ``PipelineEngine``
of any layout: other pipeline stages, TP size, data-parallel size, layer partition, ZeRO stage.

Names are ``PipelineModule``'s (DeepSpeed's too): ``N.<param>`` for the layer at index N of the
layer list, ``tied_modules.<key>.<param>`` for a tied layer, written once (its owner stages step
the same values: the first owner's are taken, as DeepSpeed's ds_to_universal.py keeps one copy of
a parameter that several stages hold). Every parameter is written whole: the TP slices of each
stage put back from the ``splits`` the save recorded (``autotp_states.whole_of``, the same
merge as AutoTP's, with ``cat_dim`` the split's dim) and, from each data-parallel group, the
ZeRO 1 shards gathered (``shard_index.ParamIndex``). ``PipeShards`` reads the checkpoint with
``universal._DslaunchShards``'s interface, so ``universal._write_from_dslaunch`` writes it.

Loading (``StageView``): each rank reads only the parameters of its own stage (the module's
names), checks each is there with its whole shape, and ``universal.load_universal_checkpoint``
does the rest as for any engine (``TPSlicedReader`` cuts this rank's TP slices, the ZeRO loader
or the stage 0 one this rank's shard). A tied parameter missing under its ``tied_modules`` name
is looked up as ``<first index of the key>.<param>``: the name a plain (not pipelined) model of
the same layer list gives it, so a ZeRO run's universal folder loads too.
"""

from __future__ import annotations

import os

import torch

from dslaunch.engine.base import partition as P
from dslaunch.engine.checkpoint.autotp_states import whole_of
from dslaunch.engine.parallel.topology import PipeModelDataParallelTopology
from dslaunch.engine.storage.files import CheckpointError, RankFiles, load_file, read_meta
from dslaunch.engine.storage.pipe_files import FORMAT, layer_file
from dslaunch.engine.storage.shard_index import ParamIndex


class PipeShards:
    """A ``dslaunch-pipe-1`` checkpoint read by parameter name: whole tensors (stages joined, TP
    slices merged, ZeRO 1 shards gathered)."""

    def __init__(self, path: str, meta: dict | None = None):
        meta = read_meta(path) if meta is None else meta
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a pipeline-engine checkpoint")
        if "shards" not in meta:
            raise CheckpointError(f"{path}/metadata.json: no 'shards' (TP layout, parameter "
                                  "names): written by an older dslaunch; load it at its own "
                                  "layout and save it again to convert it")
        self.path, self.meta = path, meta
        self.pipe, self.tp, self.dp = int(meta["pipe"]), int(meta["tp"]), int(meta["dp"])
        self.stage = int(meta.get("zero_stage") or 0)
        if self.stage not in (0, 1):
            raise CheckpointError(f"{path}: ZeRO stage {self.stage}; the pipeline engine saves "
                                  "stage 0 or 1 checkpoints")
        self.world = self.dp * self.tp  # one stage's ranks: what DeepSpeed's files call world
        self.topo = PipeModelDataParallelTopology(num_pp=self.pipe, num_mp=self.tp,
                                                  num_dp=self.dp)
        self.files = RankFiles(path, int(meta["world_size"]))
        self.model = load_file(os.path.join(path, "engine_states.pt"))
        self.model.setdefault("global_samples", 0)
        shards = meta["shards"]
        self.frozen = set()
        for s in shards.values():
            self.frozen.update(s.get("frozen_params", []))
        # name -> the stage whose files it is read from (a tied one: its first owner)
        self.owner, self.splits = {}, {}
        for s in range(self.pipe):
            info = [shards.get(f"{s}_{t}") or {} for t in range(self.tp)]
            if not info[0]:
                raise CheckpointError(f"{path}/metadata.json: no shards entry for stage {s}")
            for name, split in info[0].get("splits", {}).items():
                if name not in self.splits:  # autotp_states' form: every TP rank's ranges
                    self.splits[name] = {"dim": split["dim"], "full": split["full"],
                                         "ranges": [i["splits"][name]["ranges"] for i in info]}
            for name in info[0]["param_names"]:
                self.owner.setdefault(name, s)
        self._layers: dict = {}
        self.groups, self.hyper = self._groups()

    # -- where each value is ---------------------------------------------------------------------
    def _rank(self, stage: int, tp: int, dp: int = 0) -> int:
        return self.topo.get_rank(pipe=stage, data=dp, model=tp)

    def _layer(self, stage: int, tp: int) -> dict:
        key = (stage, tp)
        if key not in self._layers:
            self._layers[key] = load_file(layer_file(self.path, stage, tp), mmap=True,
                                          detail=False)
        return self._layers[key]

    def _local_shape(self, name: str, tp: int) -> tuple:
        layer = self._layer(self.owner[name], tp)
        if name not in layer:
            raise CheckpointError(f"{layer_file(self.path, self.owner[name], tp)}: no tensor "
                                  f"{name!r}, which metadata.json lists for this stage")
        return tuple(layer[name].shape)

    def _groups(self):
        """Per optimizer group: ``([(name, whole shape)], None, state keys, scalars)`` and the
        groups' hyperparameters (stage 0's first owner rank: every stage has the same groups)."""
        names_by_group: list = []
        keys: list = []
        scalars: list = []
        hyper: list = []
        for s in range(self.pipe):
            raw = self.files.raw(self._rank(s, 0))["strategy"]
            own = [n for n in self.meta["shards"][f"{s}_0"]["param_names"]
                   if self.owner[n] == s]
            if self.stage == 0:
                opt = raw["optimizer"]
                names = self.meta["shards"][f"{s}_0"]["param_names"]
                per_group = [[names[i] for i in g["params"]] for g in opt["param_groups"]]
                st = opt["state"]
                gkeys = [sorted(k for k, v in (st.get(g["params"][0]) or {}).items()
                                if torch.is_tensor(v) and v.dim() > 0) if g["params"] else []
                         for g in opt["param_groups"]]
                gscalars = [{k: v for k, v in (st.get(g["params"][0]) or {}).items()
                             if not (torch.is_tensor(v) and v.dim() > 0)} if g["params"] else {}
                            for g in opt["param_groups"]]
                ghyper = [{k: v for k, v in g.items() if k != "params"}
                          for g in opt["param_groups"]]
            else:
                z = self.files.zero(self._rank(s, 0))["groups"]
                per_group = [ParamIndex(P.Layout.from_meta(g["layout"])).names() for g in z]
                gkeys = [sorted(g["state"]) for g in z]
                gscalars = [dict(g["scalars"]) for g in z]
                ghyper = raw.get("param_groups", [])
            for gi, names in enumerate(per_group):
                while len(names_by_group) <= gi:
                    names_by_group.append([])
                    keys.append(gkeys[gi])
                    scalars.append(gscalars[gi])
                    hyper.append(ghyper[gi] if gi < len(ghyper) else {})
                names_by_group[gi] += [(n, self._whole_shape(n)) for n in names if n in own]
        return ([(names, None, k, sc) for names, k, sc in zip(names_by_group, keys, scalars)],
                hyper)

    def _whole_shape(self, name: str) -> tuple:
        shape = list(self._local_shape(name, 0))
        split = self.splits.get(name)
        if split is not None:
            shape[split["dim"]] = split["full"]
        return tuple(shape)

    def cat_dim(self, name: str):
        split = self.splits.get(name)
        return None if split is None else split["dim"]

    # -- values ----------------------------------------------------------------------------------
    def _local(self, name: str, key, tp: int) -> torch.Tensor:
        """TP rank ``tp``'s slice of ``name`` (``key`` None: the fp32 master), in its shape."""
        s = self.owner[name]
        shape = self._local_shape(name, tp)
        if self.stage == 1:
            found = [(gi, ParamIndex(P.Layout.from_meta(g["layout"])))
                     for gi, g in enumerate(self.files.zero(self._rank(s, tp))["groups"])]
            found = [(gi, index) for gi, index in found if name in index.where]
            if not found:
                raise CheckpointError(f"{self.path}: parameter {name!r} is in none of stage "
                                      f"{s}'s ZeRO shards")
            gi, index = found[0]

            def shard(k):
                z = self.files.zero(self._rank(s, tp, k))["groups"][gi]
                return z["master"] if key is None else z["state"][key]
            return index.gather(shard, name).reshape(shape)
        names = self.meta["shards"][f"{s}_{tp}"]["param_names"]
        i = names.index(name)
        raw = self.files.raw(self._rank(s, tp))["strategy"]
        if key is None:
            masters = raw.get("fp32_masters")
            v = masters[i] if masters is not None else self._layer(s, tp)[name]
        else:
            v = (raw["optimizer"]["state"].get(i) or {}).get(key)
            if v is None:  # never stepped
                return torch.zeros(shape)
        return v.reshape(shape)

    def gather(self, gi: int, key, name: str) -> torch.Tensor:
        parts = [self._local(name, key, t) for t in range(self.tp)]
        return whole_of(parts, name, self.splits).contiguous().float()

    def module_state_dict(self) -> dict:
        """Every module tensor (parameters, buffers) whole in fp32, tied ones once."""
        from dslaunch.engine.checkpoint.consolidate import pipe_fp32_state_dict

        sd, _ = pipe_fp32_state_dict(os.path.dirname(self.path), os.path.basename(self.path))
        return sd


# -- loading into a PipelineEngine ------------------------------------------------------------

class StageView:
    """A universal checkpoint's reader (``UniversalCheckpoint``) seen by one pipeline stage: the
    tensors of this stage's module only, each checked to be in the checkpoint with its whole
    shape; a tied parameter missing under its ``tied_modules`` name found under a plain model's
    ``<index>.<param>``."""

    def __init__(self, reader, module, whole_shapes: dict):
        self._reader = reader
        self.path = reader.path
        own = module.state_dict()
        alias = _plain_names(module)
        self.name_of = {}  # this module's name -> the checkpoint's
        missing = []
        for name in own:
            if name in reader.where:
                self.name_of[name] = name
            elif alias.get(name) in reader.where:
                self.name_of[name] = alias[name]
            elif name in _buffers(reader):
                self.name_of[name] = name
            else:
                missing.append(name)
        if missing:
            have = sorted(reader.where)
            raise CheckpointError(
                f"{reader.path}: pipeline stage {module.stage_id} parameter "
                f"{missing[0]!r} is not in the universal checkpoint (no "
                f"zero/{missing[0]}/fp32.pt; {len(missing)} of this stage's tensors missing); "
                f"it holds {len(have)} parameters, e.g. {have[:4]}. PipelineModule names layer "
                "N's parameters 'N.<param>' and a tied layer's 'tied_modules.<key>.<param>': "
                "build the model from the same layer list as the job that wrote it")
        for name, ck in self.name_of.items():
            if ck in reader.shape and tuple(reader.shape[ck]) != tuple(whole_shapes.get(
                    name, own[name].shape)):
                raise CheckpointError(
                    f"{os.path.join(reader.path, 'zero', ck, 'fp32.pt')}: parameter {ck!r} has "
                    f"shape {list(reader.shape[ck])} in the checkpoint but "
                    f"{list(whole_shapes.get(name, own[name].shape))} whole in this model "
                    f"(stage {module.stage_id}): build the model with the same sizes")
        self.where = {n: None for n, ck in self.name_of.items() if ck in reader.where}
        self.shape = {n: reader.shape[self.name_of[n]] for n in self.where}

    def __getattr__(self, attr):  # model, model_path, scalars, param_groups, client_state
        return getattr(self._reader, attr)

    def gather(self, key, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        return self._reader.gather(key, self.name_of[name], lo, hi)

    def full(self, name: str) -> torch.Tensor:
        return self._reader.full(self.name_of[name])

    def state_keys(self) -> list:
        keys = set()
        for name in self.where:
            d = os.path.join(self._reader.zero, self.name_of[name])
            keys.update(f[:-3] for f in os.listdir(d) if f.endswith(".pt"))
        return sorted(keys - {"fp32", "step"})

    def module_state_dict(self) -> dict:
        buffers = _buffers(self._reader)
        module = self._reader.model.get("module") or {}
        return {n: (module[ck].clone() if ck in buffers and ck in module
                    else self._reader.full(ck))
                for n, ck in self.name_of.items()}


def _buffers(reader) -> set:
    return set(reader.model.get("buffer_names") or []) & set(reader.model.get("module") or {})


def _plain_names(module) -> dict:
    """``tied_modules.<key>.<rest>`` -> ``<first layer index of key>.<rest>`` (where a plain,
    unpipelined model of the same layer list holds that tensor)."""
    from dslaunch.engine.parallel.pipe.module import TiedLayerSpec

    first = {}
    for idx, spec in enumerate(getattr(module, "_layer_specs", [])):
        if isinstance(spec, TiedLayerSpec):
            first.setdefault(spec.key, idx)
    out = {}
    for name in module.state_dict():
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "tied_modules" and parts[1] in first:
            out[name] = f"{first[parts[1]]}.{parts[2]}"
    return out
