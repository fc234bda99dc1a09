"""MoE gate and layer cases run by DeepSpeed and by dslaunch alike (the same code against either
package's ``moe.sharded_moe`` / ``moe.layer``), for tests/test_moe_gating.py.

    python moe_gate_cases.py --impl deepspeed OUT.pt    # in the peer venv
    run(sharded_moe, layer_module)                        # in-process, dslaunch's modules

Each case seeds torch, draws its inputs and runs: the gate functions with sparse routes (and one
dense), then whole MoE layers (weights drawn by name, each expert different) through a forward and
a backward of ``(out ** 2).sum() + l_aux``. The results are a dict of tensors.
"""

from __future__ import annotations

import argparse
import os

import torch

GATES = [  # (name, function, kwargs): logits are [S=24, E=4] (top-k: E=6)
    ("top1_rts", "top1gating", dict(capacity_factor=1.0, min_capacity=2)),
    ("top1_position", "top1gating", dict(capacity_factor=1.0, min_capacity=2, use_rts=False)),
    ("top1_rsample", "top1gating", dict(capacity_factor=1.5, min_capacity=2,
                                        noisy_gate_policy="RSample")),
    ("top1_dropless", "top1gating", dict(capacity_factor=1.0, min_capacity=2, drop_tokens=False)),
    ("top1_min_capacity", "top1gating", dict(capacity_factor=0.1, min_capacity=5)),
    ("top1_used_token", "top1gating", dict(capacity_factor=1.0, min_capacity=2, used_token=True)),
    ("top2", "top2gating", dict(capacity_factor=1.0, min_capacity=2)),
    ("top2_nosample", "top2gating", dict(capacity_factor=0.75, min_capacity=2,
                                         top2_2nd_expert_sampling=False)),
    ("top2_dropless", "top2gating", dict(capacity_factor=1.0, min_capacity=2, drop_tokens=False)),
    ("top3", "topkgating", dict(k=3, capacity_factor=1.0, min_capacity=2)),
    ("top3_dropless", "topkgating", dict(k=3, capacity_factor=1.0, min_capacity=2,
                                         drop_tokens=False)),
]

LAYERS = [  # MoE keyword arguments
    ("layer_top1", dict(num_experts=4, k=1, min_capacity=2)),
    ("layer_top1_jitter_residual", dict(num_experts=4, k=1, min_capacity=2, use_residual=True,
                                        noisy_gate_policy="Jitter", capacity_factor=1.25)),
    ("layer_top2", dict(num_experts=4, k=2, min_capacity=2)),
    ("layer_top2_dropless", dict(num_experts=4, k=2, drop_tokens=False)),
    ("layer_top3", dict(num_experts=6, k=3, min_capacity=2, eval_capacity_factor=2.0)),
]

HIDDEN = 8


def _expert():
    return torch.nn.Sequential(torch.nn.Linear(HIDDEN, 16), torch.nn.GELU(),
                               torch.nn.Linear(16, HIDDEN))


def _fill(module, seed):
    """Every parameter drawn by its name's position (same names in both packages)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def run(sharded_moe, layer_module) -> dict:
    out = {}
    for i, (name, fn, kw) in enumerate(GATES):
        kw = dict(kw)
        torch.manual_seed(100 + i)
        experts = 6 if fn == "topkgating" else 4
        logits = torch.randn(24, experts) * 2
        if kw.pop("used_token", False):
            kw["used_token"] = (torch.arange(24) % 3 != 0).float()
        res = getattr(sharded_moe, fn)(logits, sparse_routes=True, **kw)
        l_aux, capacity, _, indices, locations, gates, exp_counts = res
        out.update({f"{name}.l_aux": l_aux, f"{name}.capacity": torch.tensor(int(capacity)),
                    f"{name}.indices": indices.long(), f"{name}.locations": locations.long(),
                    f"{name}.gates": gates, f"{name}.exp_counts": exp_counts.long()})
        if name == "top2":  # the dense form too
            torch.manual_seed(100 + i)
            logits = torch.randn(24, experts) * 2
            _, combine, dispatch, _ = sharded_moe.top2gating(logits, **kw)
            out[f"{name}.combine"], out[f"{name}.dispatch"] = combine, dispatch.long()
    for i, (name, kw) in enumerate(LAYERS):
        torch.manual_seed(200 + i)
        moe = layer_module.MoE(HIDDEN, _expert(), **kw)
        if hasattr(moe, "set_deepspeed_parallelism"):
            moe.set_deepspeed_parallelism()
        _fill(moe, 300 + i)
        x = torch.randn(3, 8, HIDDEN, requires_grad=True)
        torch.manual_seed(400 + i)
        y, l_aux, counts = moe(x)
        ((y ** 2).sum() + l_aux).backward()
        out.update({f"{name}.out": y.detach(), f"{name}.l_aux": l_aux.detach(),
                    f"{name}.exp_counts": counts.long(), f"{name}.x_grad": x.grad})
        for pname, p in moe.named_parameters():
            out[f"{name}.grad.{pname}"] = p.grad
        moe.eval()
        with torch.no_grad():
            out[f"{name}.eval_out"] = moe(x)[0]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["deepspeed", "dslaunch"], required=True)
    ap.add_argument("out")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if args.impl == "deepspeed":
        import deepspeed
        from deepspeed.moe import layer, sharded_moe

        deepspeed.init_distributed("gloo")
    else:
        import torch.distributed as dist

        from dslaunch.moe import layer, sharded_moe

        dist.init_process_group("gloo")
    torch.save(run(sharded_moe, layer), args.out)


if __name__ == "__main__":
    main()
