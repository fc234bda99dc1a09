"""``PipelineModule``: a model given as a list of layers, cut into contiguous stages; each rank
builds only the layers of its own stage (DeepSpeed's ``deepspeed.pipe`` API).

- ``LayerSpec(cls, *args, **kwargs)``: a layer described, built later (only on its owner).
- ``TiedLayerSpec(key, cls, ..., forward_fn=None, tied_weight_attr="weight")``: every spec with
  the same ``key`` shares one module per stage (e.g. the embedding used again as the output
  head). At start the owners' weights are made equal (broadcast from the first owner stage);
  after backward the tied weights' gradients are summed over the owner stages.
- plain ``nn.Module`` instances and callables (``lambda x: ...``) are accepted as layers.

Partitioning (``partition_method``): ``parameters`` balances the parameter counts (counted on
the meta device: nothing is allocated), ``uniform`` the number of layers, ``type:REGEX`` the
number of layers whose class name matches REGEX. Contiguous parts, each non-empty, minimising the
largest part. ``seed_layers=True`` seeds ``base_seed + layer index`` before building each layer,
so a layer's initial weights do not depend on which stage builds it.
"""

from __future__ import annotations

import re
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from dslaunch.engine.parallel.topology import ProcessTopology, build_grid, get_grid, stand_ins


class LayerSpec:
    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise TypeError(f"LayerSpec: {typename!r} is not an nn.Module class")
        self.typename, self.module_args, self.module_kwargs = typename, module_args, module_kwargs

    def build(self, log=False) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self):
        return f"LayerSpec({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr="weight",
                 **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key, self.forward_fn = key, forward_fn
        self.tied_weight_attr = ([tied_weight_attr] if isinstance(tied_weight_attr, str)
                                 else list(tied_weight_attr))

    def __repr__(self):
        return f"TiedLayerSpec({self.key!r}, {self.typename.__name__})"


def partition_balanced(weights: list, parts: int) -> list:
    """Boundaries ``[0, b1, ..., n]`` of ``parts`` contiguous non-empty parts minimising the
    largest part's weight sum (ties: the earliest boundaries)."""
    n = len(weights)
    if parts < 1 or n < parts:
        raise ValueError(f"PipelineModule: {n} layers cannot fill {parts} stages (each stage "
                         "needs at least one layer)")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: minimal max-part of the first i items in k parts; cut[k][i]: last boundary
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    bounds, i = [n], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]


def _count_params(layer) -> int:
    if isinstance(layer, LayerSpec):
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            layer = layer.build()
    if isinstance(layer, nn.Module):
        return sum(p.numel() for p in layer.parameters())
    return 0


def _type_name(layer) -> str:
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    return type(layer).__name__


class PipelineModule(nn.Module):
    def __init__(self, layers, num_stages=None, topology: ProcessTopology | None = None,
                 loss_fn=None, seed_layers=False, seed_fn=None, base_seed=1234,
                 partition_method="parameters", activation_checkpoint_interval=0,
                 activation_checkpoint_func=checkpoint, checkpointable_layers=None):
        super().__init__()
        if topology is None and num_stages is None:
            raise ValueError("PipelineModule: give num_stages= or topology=")
        self._layer_specs = list(layers)
        if topology is not None:
            if dist.is_initialized() is False:
                from dslaunch.engine.comm.collectives import init_distributed
                init_distributed()
            self.grid = get_grid(topology)
            if num_stages is not None and num_stages != self.grid.num_stages:
                raise ValueError(f"PipelineModule: num_stages={num_stages} but the topology has "
                                 f"{self.grid.num_stages} pipe stages")
        else:
            self.grid = build_grid(pipe=int(num_stages), model=1)
        self._topo = self.grid.topology
        self.num_stages = self.grid.num_stages
        self.stage_id = self.grid.stage_id
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.activation_checkpoint_interval = int(activation_checkpoint_interval or 0)
        self.activation_checkpoint_func = activation_checkpoint_func
        self.checkpointable_layers = checkpointable_layers
        self.partition_method = partition_method

        self.parts = self._partition(partition_method)
        self._local_start, self._local_stop = self.parts[self.stage_id], self.parts[self.stage_id + 1]
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict = {}
        self.forward_funcs: list = []
        self._build()
        self.tied_groups = self.make_tied_groups(self._new_group())

    # -- partitioning --------------------------------------------------------------------------
    def _partition(self, method) -> list:
        specs, n, method = self._layer_specs, len(self._layer_specs), str(method)
        low = method.lower()
        if low == "uniform":
            weights = [1] * n
        elif low == "parameters":
            weights = [_count_params(s) for s in specs]
            if sum(weights) == 0:
                weights = [1] * n
        elif low.startswith("type:"):
            regex = re.compile(method.split(":", 1)[1], re.IGNORECASE)
            weights = [1 if regex.search(_type_name(s)) else 0 for s in specs]
            if sum(weights) == 0:
                raise ValueError(f"PipelineModule: partition_method {method!r} matches no layer "
                                 f"(layer types: {sorted({_type_name(s) for s in specs})})")
        else:
            raise ValueError(f"PipelineModule: partition_method {method!r}: use 'parameters', "
                             "'uniform' or 'type:REGEX'")
        if low.startswith("type:") or low == "parameters":
            return self._balance_with_empty(weights)
        return partition_balanced(weights, self.num_stages)

    def _balance_with_empty(self, weights) -> list:
        # weight-0 layers (activations, norms, lambdas) must not make a stage empty: give every
        # layer a tiny weight so ties spread them; the real weights dominate
        eps = max(1, sum(weights)) * 1e-9
        return partition_balanced([w + eps for w in weights], self.num_stages)

    def stage_layers(self, stage_id: int) -> range:
        return range(self.parts[stage_id], self.parts[stage_id + 1])

    # -- building ------------------------------------------------------------------------------
    def _seed(self, idx):
        if self.seed_layers:
            (self.seed_fn or torch.manual_seed)(self.base_seed + idx)

    def _build(self):
        for idx in range(self._local_start, self._local_stop):
            layer = self._layer_specs[idx]
            if isinstance(layer, TiedLayerSpec):
                if layer.key not in self.tied_modules:
                    self._seed(idx)
                    self.tied_modules[layer.key] = layer.build()
                    self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                module = self.tied_modules[layer.key]
                fn = partial(layer.forward_fn, module) if layer.forward_fn is not None else module
                self.forward_funcs.append(fn)
            elif isinstance(layer, LayerSpec):
                self._seed(idx)
                module = layer.build()
                self.add_module(str(idx), module)
                self.forward_funcs.append(module)
            elif isinstance(layer, nn.Module):
                self.add_module(str(idx), layer)
                self.forward_funcs.append(layer)
            elif callable(layer):
                self.forward_funcs.append(layer)
            else:
                raise TypeError(f"PipelineModule: layer {idx} ({layer!r}) is not a LayerSpec, an "
                                "nn.Module or a callable")

    # -- tied weights --------------------------------------------------------------------------
    def _new_group(self):
        """How this rank makes groups: ``dist.new_group``, or stand-ins while it is a replacement
        rank of an in-process recovery building alone (its grid is planned: topology.planned_grid)."""
        if self.grid.planned:
            return stand_ins(self.grid.global_rank)
        return dist.new_group

    def make_tied_groups(self, new_group) -> dict:
        """{key: (group, owner global ranks)} for keys owned by more than one stage and held
        here; every rank creates every group with ``new_group`` (collective). Called again by
        in-process recovery on a new world (engine/recovery/pipe.py)."""
        owners: dict = {}
        for s in range(self.num_stages):
            for idx in self.stage_layers(s):
                spec = self._layer_specs[idx]
                if isinstance(spec, TiedLayerSpec):
                    stages = owners.setdefault(spec.key, [])
                    if s not in stages:
                        stages.append(s)
        mine = {}
        for key in sorted(owners, key=str):
            stages = owners[key]
            if len(stages) < 2:
                continue
            for pipe_ranks in self._topo.get_axis_comm_lists("pipe"):
                ranks = [pipe_ranks[s] for s in stages]
                group = new_group(ranks)
                if self.grid.global_rank in ranks:
                    mine[key] = (group, ranks)
        return mine

    def _tied_params(self, key) -> list:
        module = self.tied_modules[key]
        out = []
        for attr in self.tied_weight_attrs[key]:
            obj = module
            for part in attr.split("."):
                obj = getattr(obj, part)
            out.append(obj)
        return out

    def sync_tied_weights(self) -> None:
        """Make every owner start from the first owner stage's tied weights (not a replacement
        rank building alone: it takes its weights from a live replica once it joins)."""
        if self.grid.planned:
            return
        with torch.no_grad():
            for key, (group, ranks) in self.tied_groups.items():
                for p in self._tied_params(key):
                    dist.broadcast(p.data, src=ranks[0], group=group)

    def allreduce_tied_weight_gradients(self, grad_of=None) -> None:
        """Sum the tied weights' gradients over their owner stages. ``grad_of(p)`` picks the
        tensor holding p's gradient (default ``p.grad``)."""
        for key, (group, _) in self.tied_groups.items():
            for p in self._tied_params(key):
                g = grad_of(p) if grad_of is not None else p.grad
                if g is not None:
                    dist.all_reduce(g, group=group)

    # -- forward -------------------------------------------------------------------------------
    def _run(self, start, stop):
        def run(*x):
            x = x[0] if len(x) == 1 else x
            for fn in self.forward_funcs[start:stop]:
                x = fn(x)
            return x
        return run

    def forward(self, x):
        n = len(self.forward_funcs)
        k = self.activation_checkpoint_interval
        if k <= 0 or not torch.is_grad_enabled():
            return self._run(0, n)(x)
        for start in range(0, n, k):
            stop = min(start + k, n)
            args = x if isinstance(x, tuple) else (x,)
            x = self.activation_checkpoint_func(self._run(start, stop), *args, use_reentrant=False)
        return x

    def topology(self) -> ProcessTopology:
        return self._topo

    def num_pipeline_stages(self) -> int:
        return self.num_stages

    def extra_repr(self):
        return f"stage {self.stage_id}/{self.num_stages}, layers [{self._local_start}, " \
               f"{self._local_stop}), parts {self.parts}"
