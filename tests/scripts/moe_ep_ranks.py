"""Rank script (4 ranks, gloo): the same two-MoE-layer model (a pyramid: 4 then 8 experts; top-1
with random token selection, then top-2 dropless with a residual MLP) at expert-parallel sizes
(1, 1), (2, 2), (4, 4) and (2, 4) gives the same outputs, l_aux and gradients as at (1, 1):
expert gradients summed over their expert-data-parallel group, dense ones over the world, as
the engine reduces them. Also the groups' ranks (DeepSpeed's E + D layout) and, run with
``--as-deepspeed``, that ``deepspeed.moe`` is dslaunch's. Writes --out/rank_{r}.json."""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import dslaunch
from dslaunch.moe.layer import MoE
from dslaunch.moe.utils import is_moe_param
from dslaunch.utils import groups

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args, _ = p.parse_known_args()  # --as-deepspeed adds --local_rank
dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
H = 8
res = {}


def expert():
    return nn.Sequential(nn.Linear(H, 12), nn.GELU(), nn.Linear(12, H))


class Model(nn.Module):
    def __init__(self, ep_a, ep_b):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(H, H)
        self.moe_a = MoE(H, expert(), num_experts=4, ep_size=ep_a, k=1, capacity_factor=1.0,
                         min_capacity=2)
        self.moe_b = MoE(H, expert(), num_experts=8, ep_size=ep_b, k=2, drop_tokens=False,
                         use_residual=True)
        g = torch.Generator().manual_seed(1)  # every global expert different, at any ep size
        with torch.no_grad():
            for _, p in sorted(self.named_parameters()):
                if not is_moe_param(p):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.4)
            for moe in (self.moe_a, self.moe_b):
                moe.set_deepspeed_parallelism()
                for eid, local in zip(moe.expert_ids(), moe.deepspeed_moe.experts.deepspeed_experts):
                    ge = torch.Generator().manual_seed(100 + 10 * moe.num_experts + eid)
                    for _, p in sorted(local.named_parameters()):
                        p.copy_(torch.randn(p.shape, generator=ge) * 0.4)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h, la, _ = self.moe_a(h)
        h, lb, _ = self.moe_b(h)
        return h, la + lb


def run(ep_a, ep_b):
    model = Model(ep_a, ep_b)
    torch.manual_seed(1000 + rank)  # this rank's tokens and random draws, alike at every ep
    x = torch.randn(2, 12, H)
    out, l_aux = model(x)
    ((out ** 2).mean() + 0.1 * l_aux).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.clone()
        group = (groups._get_expert_data_parallel_group(p.group_name) if is_moe_param(p)
                 else None)
        dist.all_reduce(g, group=group)
        grads[name] = g
    experts = {}  # (layer, global expert id) -> {param suffix: grad}
    for lname in ("moe_a", "moe_b"):
        moe = getattr(model, lname)
        for eid, j in zip(moe.expert_ids(), range(moe.num_local_experts)):
            prefix = f"{lname}.deepspeed_moe.experts.deepspeed_experts.{j}."
            experts[(lname, eid)] = {n[len(prefix):]: g for n, g in grads.items()
                                     if n.startswith(prefix)}
    dense = {n: g for n, g in grads.items() if ".deepspeed_experts." not in n}
    res[f"dropped_{ep_a}_{ep_b}"] = model.moe_a.deepspeed_moe.tokens_dropped.item()
    return out.detach(), l_aux.detach(), dense, experts


def err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


ref_out, ref_aux, ref_dense, ref_experts = run(1, 1)
for ep_a, ep_b in ((2, 2), (4, 4), (2, 4)):
    out, aux, dense, experts = run(ep_a, ep_b)
    key = f"ep{ep_a}_{ep_b}"
    res[f"{key}_out"] = err(out, ref_out)
    res[f"{key}_aux"] = err(aux, ref_aux)
    res[f"{key}_dense_grad"] = max(err(g, ref_dense[n]) for n, g in dense.items())
    res[f"{key}_expert_grad"] = max(err(g, ref_experts[k][n]) for k, e in experts.items()
                                    for n, g in e.items())
    res[f"{key}_experts_here"] = sorted(f"{k[0]}:{k[1]}" for k in experts)

res["groups"] = {name: [groups._get_expert_parallel_group_ranks(name),
                        groups._get_expert_data_parallel_group_ranks(name),
                        groups._get_expert_parallel_world_size(name),
                        groups._get_expert_parallel_rank(name),
                        groups._get_expert_data_parallel_rank(name)]
                 for name in sorted(groups._get_expert_parallel_group_dict())}
res["max_expert_size"] = groups._get_max_expert_size()
res["grad_nonzero"] = bool(ref_dense["moe_a.deepspeed_moe.gate.wg.weight"].abs().sum() > 0)
try:
    import deepspeed.moe.layer
    import deepspeed.moe.utils

    res["as_deepspeed"] = (deepspeed.moe.layer.MoE is MoE
                           and deepspeed.moe.utils.is_moe_param is is_moe_param)
except ImportError:
    res["as_deepspeed"] = None
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(res))
