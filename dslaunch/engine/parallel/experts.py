"""Expert (mixture-of-experts) parameters as the engine sees them.

DeepSpeed's contract, which ``dslaunch.moe`` follows: an expert parameter carries
``allreduce = False`` and ``group_name = "ep_size_{N}"``; the ``N`` ranks of an expert-parallel
group each hold different experts, and the ranks that hold the same experts form that name's
expert-data-parallel group (``dslaunch.utils.groups``). So the engine

- reduces an expert's gradient over its expert-data-parallel group, but scales it as a dense one
  (by the data-parallel size: DeepSpeed's ``_reduce_expert_gradients``), so the gradient does not
  depend on ``ep_size``;
- partitions (ZeRO 1, 2) an expert optimizer group within that same group;
- starts every replica of an expert from the weights of its expert-data-parallel rank 0;
- counts every expert once in the global gradient norm.

Checkpoints name experts by their global id (``global_names``): a load at another ``ep_size`` or
world size finds each expert by that name.
"""

from __future__ import annotations

import re

import torch

from dslaunch.engine.parallel.moe.params import is_moe_param

# DeepSpeed's MoE layer keeps its experts in ``...deepspeed_experts.{local id}...``
_LOCAL_ID = re.compile(r"^(?P<head>.*\.deepspeed_experts\.)(?P<id>\d+)(?P<tail>\..*)$")


def is_expert(p: torch.Tensor) -> bool:
    """DeepSpeed's ``is_moe_param``: the parameter opted out of the data-parallel all-reduce."""
    return is_moe_param(p)


def expert_group(p: torch.Tensor):
    """The parameter's expert group name (``ep_size_{N}``), or None for a dense parameter."""
    return getattr(p, "group_name", None) if is_expert(p) else None


def has_experts(model: torch.nn.Module) -> bool:
    return any(is_expert(p) for p in model.parameters())


def set_up_parallelism(model: torch.nn.Module) -> None:
    """Have each MoE layer make (or find) its expert groups, as DeepSpeed's engine does before it
    builds the optimizer."""
    for m in model.modules():
        if hasattr(m, "set_deepspeed_parallelism"):
            m.set_deepspeed_parallelism()


def split_optimizer_groups(optimizer) -> None:
    """Make every optimizer param group hold dense parameters only or one expert group's only
    (what ``split_params_into_different_moe_groups_for_optimizer`` gives a script that calls it):
    an expert group gets ``moe: True`` and ``name: group_name`` and its parent's hyperparameters.
    Done in place, before the optimizer has state."""
    out = []
    for group in optimizer.param_groups:
        by_name: dict = {}
        dense = []
        for p in group["params"]:
            name = expert_group(p)
            (dense if name is None else by_name.setdefault(name, [])).append(p)
        if not by_name:
            out.append(group)
            continue
        hyper = {k: v for k, v in group.items() if k not in ("params", "moe", "name")}
        if dense:
            out.append({**hyper, "params": dense,
                        **({"name": group["name"]} if "name" in group else {})})
        for name, params in by_name.items():
            out.append({**hyper, "params": params, "moe": True, "name": name})
    optimizer.param_groups[:] = out


class ExpertGroups:
    """The expert groups of one model: per group name, the expert-data-parallel ``Comm`` (its
    accounting books into the engine's ``comm``) and this rank's place in the expert-parallel
    group."""

    def __init__(self, model: torch.nn.Module, comm):
        self.names = sorted({expert_group(p) for p in model.parameters() if is_expert(p)})
        self._edp, self.ep_rank, self.ep_size = {}, {}, {}
        if not self.names:
            return
        from dslaunch.engine.comm.collectives import Comm
        from dslaunch.engine.parallel import expert_groups as groups

        for name in self.names:
            c = Comm(groups._get_expert_data_parallel_group(name))
            c._stats = comm._stats  # one book for the engine's comm_stats()
            self._edp[name] = c
            self.ep_rank[name] = groups._get_expert_parallel_rank(name)
            self.ep_size[name] = groups._get_expert_parallel_world_size(name)

    def book_into(self, comm) -> None:
        """The MoE layers' all-to-alls (``dslaunch.comm`` calls on the expert-parallel groups)
        book into ``comm``'s table too, so ``engine.comm_stats()`` shows them."""
        from dslaunch.engine.comm.api import record_comm
        from dslaunch.engine.comm.collectives import Comm
        from dslaunch.engine.parallel import expert_groups as groups

        for name in self.names:
            c = Comm(groups._get_expert_parallel_group(name))
            c._stats = comm._stats
            record_comm(c)

    def __bool__(self) -> bool:
        return bool(self.names)

    def comm(self, name, dense_comm):
        """The group a parameter of ``name`` (None: dense) is reduced and partitioned in."""
        return dense_comm if name is None else self._edp[name]

    def norm_weight(self, name) -> float:
        """What a squared norm of ``name``'s gradients counts for in a sum over the data-parallel
        ranks: every expert-data-parallel replica adds the same value, so each adds its share."""
        return 1.0 if name is None else 1.0 / self._edp[name].world_size

    def broadcast(self, model: torch.nn.Module) -> None:
        """Every replica of an expert starts from its expert-data-parallel rank 0's weights
        (``zero.base.broadcast_model`` leaves experts to this)."""
        import torch.distributed as dist

        with torch.no_grad():
            for p in model.parameters():
                name = expert_group(p)
                if name is None:
                    continue
                c = self._edp[name]
                if c.world_size > 1:
                    c.broadcast(p.data, dist.get_global_rank(c.group, 0))

    # -- names in checkpoints ------------------------------------------------------------------
    def global_names(self, model: torch.nn.Module) -> dict:
        """{local parameter name: (name with the expert's global id, MoE layer id, global expert
        id)} for every expert parameter under ``deepspeed_experts.{local id}``. Global id =
        expert-parallel rank x local experts per rank + local id, layers numbered in module order
        (DeepSpeed's ``layer_{layer}_expert_{id}`` numbering)."""
        local_ids: dict = {}  # layer prefix -> local expert ids
        found = []
        for n, p in model.named_parameters():
            name = expert_group(p)
            m = _LOCAL_ID.match(n) if name is not None else None
            if m is None:
                continue
            found.append((n, name, m))
            local_ids.setdefault(m["head"], set()).add(int(m["id"]))
        layer_of = {head: i for i, head in enumerate(local_ids)}
        out = {}
        for n, name, m in found:
            gid = self.ep_rank[name] * len(local_ids[m["head"]]) + int(m["id"])
            out[n] = (f"{m['head']}{gid}{m['tail']}", layer_of[m["head"]], gid)
        return out

    def all_experts(self, model: torch.nn.Module) -> list:
        """[(MoE layer id, global expert id)] of every expert of the model, on all ranks."""
        ids = self.global_names(model)
        local: dict = {}  # layer -> this rank's global expert ids
        ep: dict = {}  # layer -> its expert-parallel size
        for n, p in model.named_parameters():
            if n in ids:
                _, layer, gid = ids[n]
                local.setdefault(layer, set()).add(gid)
                ep[layer] = self.ep_size[expert_group(p)]
        return [(layer, gid) for layer in sorted(local)
                for gid in range(len(local[layer]) * ep[layer])]

    def writes_experts(self, name) -> bool:
        """Whether this rank writes ``name``'s experts to a checkpoint: one replica of each."""
        return self._edp[name].rank == 0


def refuse_stage3(model, stage: int) -> None:
    if stage == 3 and has_experts(model):
        raise ValueError("ZeRO stage 3 with MoE expert parameters is not supported by dslaunch "
                         "yet: use ZeRO stage 0, 1 or 2")
