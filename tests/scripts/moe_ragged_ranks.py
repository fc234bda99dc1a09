"""Rank script (2 ranks, gloo): the ragged dropless dispatch (dslaunch/engine/parallel/moe/ragged.py)
against the padded one on the same MoE layer, weights and tokens, at EP 2 with 4 experts (2 per
rank): top-1, top-2, top-1 with a gate that never picks expert 3 (a rank's local expert with
no token at all), and top-1 with ``used_token`` masking about 30% of the tokens out. Per case:
the largest relative difference of the outputs, l_aux, the input's gradient and every
parameter's gradient; every used token's choices routed; the all-to-all bytes each path
booked in the ep group's comm statistics, with the choices this rank routes and those its
experts receive, the layer's expert count and the padded buffer's capacity, so the test can
check that the ragged path sends exactly the routed tokens (plus the per-expert count
exchange). Writes --out/rank_{r}.json."""

import argparse
import copy
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import dslaunch
from dslaunch.engine.comm import api as comm_api
from dslaunch.moe.layer import MoE

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
dslaunch.init_distributed()
rank = dist.get_rank()
H, E, EP = 16, 4, 2


def err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def a2a_bytes(group) -> int:
    return comm_api.recorded_comm(group).stats().get("all_to_all", {}).get("bytes", 0)


def step(moe, x, used=None):
    """forward + backward; (output, l_aux, input grad, param grads, bytes booked)"""
    x = x.clone().requires_grad_()
    group = moe.deepspeed_moe.ep_group
    before = a2a_bytes(group)
    out, l_aux, _ = moe(x, used)
    ((out ** 2).mean() + 0.1 * l_aux).backward()
    grads = {n: q.grad.clone() for n, q in moe.named_parameters()}
    return out.detach(), l_aux.detach(), x.grad, grads, a2a_bytes(group) - before


def case(name, k, never_expert_3=False, some_unused=False):
    torch.manual_seed(7)  # the same weights on both ranks
    expert = nn.Sequential(nn.Linear(H, 24), nn.GELU(), nn.Linear(24, H))
    moe = MoE(H, expert, num_experts=E, ep_size=EP, k=k, drop_tokens=False, use_rts=False,
              top2_2nd_expert_sampling=False)
    with torch.no_grad():
        for local in moe.deepspeed_moe.experts.deepspeed_experts:  # distinct experts
            for q in local.parameters():
                q.add_(torch.randn(q.shape) * 0.3)
        if never_expert_3:  # inputs have x[..., 0] = 6: expert 3's logit far below the rest
            w = moe.deepspeed_moe.gate.wg.weight
            w[:, 0] += torch.tensor([3.0, 3.0, 3.0, -3.0])
    torch.manual_seed(100 + rank)  # this rank's tokens: uneven loads, different per rank
    x = torch.randn(3, 20, H) * 2
    if never_expert_3:
        x[..., 0] = 6.0
    used = (torch.rand(x.shape[0] * x.shape[1]) > 0.3).long() if some_unused else None
    padded = copy.deepcopy(moe)  # before the groups: a process group does not copy
    padded.deepspeed_moe.ragged_dropless = False
    for layer in (moe, padded):
        layer.set_deepspeed_parallelism()
    r_out, r_aux, r_xg, r_grads, r_bytes = step(moe, x, used)
    routes = moe.deepspeed_moe
    routed = int((routes.gate.routes(x.reshape(-1, H), used).indices >= 0).sum())
    p_out, p_aux, p_xg, p_grads, p_bytes = step(padded, x, used)
    # the padded buffer's rows: E x the busiest expert's count over the group
    counts = routes.exp_counts.clone()
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=routes.ep_group)
    # the choices this rank's experts take (from both ranks)
    total = routes.exp_counts.clone()
    dist.all_reduce(total, group=routes.ep_group)
    received = int(total.view(EP, -1)[rank].sum())
    res[name] = {"out": err(r_out, p_out), "aux": err(r_aux, p_aux), "x_grad": err(r_xg, p_xg),
                 "param_grad": max(err(g, p_grads[n]) for n, g in r_grads.items()),
                 "dropped": routes.tokens_dropped.item(), "tokens": x.shape[0] * x.shape[1],
                 "k": k, "routed": routed, "used": x.shape[0] * x.shape[1] if used is None
                 else int(used.sum()), "received": received, "experts": E, "hidden": H, "dtype_bytes": 4,
                 "count_dtype_bytes": routes.exp_counts.element_size(),
                 "ragged_bytes": r_bytes, "padded_bytes": p_bytes,
                 "padded_capacity": int(counts.max()),
                 "expert_3_tokens": int(routes.exp_counts[3])}


res = {}
case("top1", 1)
case("top2", 2)
case("top1_idle_expert", 1, never_expert_3=True)
case("top1_used_token", 1, some_unused=True)
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(res))
