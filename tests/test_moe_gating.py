"""MoE gates and the MoE layer on one rank: hand-computed capacity, drops and l_aux; dropless
routes every token; the layer against a plain per-token reference; and DeepSpeed 0.19.8's own
gates and layer on the same inputs and weights (run in the peer venv when there is one: see
benchmarks/peers.py): the same routing decisions, slots, gate weights, l_aux and exp_counts
(exactly), outputs and gradients to 1e-6."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pytest
import torch

from dslaunch.engine.parallel.moe import gating
from dslaunch.moe import layer as moe_layer
from dslaunch.moe import sharded_moe
from helpers import ROOT, SCRIPTS

L3 = math.log(3.0)  # softmax([log 3, 0]) = [0.75, 0.25]


def _logits(to_first: int, to_second: int) -> torch.Tensor:
    return torch.tensor([[L3, 0.0]] * to_first + [[0.0, L3]] * to_second)


def test_top1_capacity_drops_and_l_aux_by_hand():
    r = gating.top1_routes(_logits(6, 2), capacity_factor=1.0, min_capacity=1, use_rts=False)
    # capacity ceil(8 tokens / 2 experts * 1.0) = 4: expert 0 keeps 4 of its 6, expert 1 both
    assert r.capacity == 4 and r.exp_counts.tolist() == [6, 2]
    kept0 = [s for s in range(6) if r.indices[0, s] == 0]
    assert len(kept0) == 4 and (r.indices[0, :6] == -1).sum() == 2
    assert r.indices[0, 6:].tolist() == [1, 1] and r.locations[0, 6:].tolist() == [0, 1]
    assert sorted(r.locations[0, kept0].tolist()) == [0, 1, 2, 3]
    assert torch.allclose(r.gates[0, kept0], torch.tensor(0.75)) and (r.gates[0] == 0).sum() == 2
    # l_aux = E * sum_e(mean prob_e * fraction_e) = 2 * (5/8 * 6/8 + 3/8 * 2/8)
    assert r.l_aux.item() == pytest.approx(1.125, abs=1e-6)
    # min_capacity wins over a small factor: ceil(4 * 0.25) = 1 -> 3
    r = gating.top1_routes(_logits(6, 2), capacity_factor=0.25, min_capacity=3, use_rts=False)
    assert r.capacity == 3 and (r.indices[0] == 0).sum() == 3 and (r.indices[0] == 1).sum() == 2


def test_dropless_routes_every_token():
    r = gating.top1_routes(_logits(6, 2), 1.0, 1, drop_tokens=False)
    assert r.capacity == 6 and (r.indices >= 0).all()
    assert sorted(r.locations[0, :6].tolist()) == list(range(6))
    torch.manual_seed(0)
    logits = torch.randn(40, 4) * 3
    for routes in (gating.top2_routes(logits, 1.0, 1, drop_tokens=False),
                   gating.topk_routes(logits, 3, 1.0, 1, drop_tokens=False)):
        assert (routes.indices >= 0).all() and routes.capacity == routes.exp_counts.max()
        assert torch.allclose(routes.gates.sum(0), torch.ones(40))


def test_top2_position_drops_by_hand():
    # all 6 tokens: 1st choice expert 0, 2nd expert 1 (no sampling); capacity ceil(6/3*2) = 4
    logits = torch.tensor([[2.0, 1.0, 0.0]] * 6)
    r = gating.top2_routes(logits, 1.0, 1, top2_2nd_expert_sampling=False)
    assert r.capacity == 4 and r.exp_counts.tolist() == [6, 6, 0]
    assert r.indices[0].tolist() == [0] * 4 + [-1] * 2  # the first 4 by position
    assert r.indices[1].tolist() == [1] * 4 + [-1] * 2
    p = torch.softmax(logits[0], 0)
    assert torch.allclose(r.gates[0, :4], p[0] / (p[0] + p[1]))  # renormalised over the two
    me, ce = p, torch.tensor([1.0, 0.0, 0.0])
    assert r.l_aux.item() == pytest.approx((me * ce).mean().item() * 9, abs=1e-6)


def test_topk_drops_the_lowest_gates():
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]] * 2 + [[2.0, 3.0, 0.0, 0.0]] * 2
                          + [[0.5, 0.0, 0.0, 0.0]] * 4)
    r = gating.topk_routes(logits, k=2, capacity_factor=0.25, min_capacity=1)
    assert r.capacity == 1  # ceil(8 / 4 * 0.25 * 2)
    # expert 0's highest gate goes to a token of rows 0-1, expert 1's to rows 2-3
    kept = {(int(e), s) for j in range(2) for s, e in enumerate(r.indices[j]) if e >= 0}
    assert {e for e, _ in kept} >= {0, 1} and all(s < 4 for e, s in kept if e in (0, 1))


def test_layer_against_a_per_token_reference(world_of_one):
    torch.manual_seed(0)
    expert = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    moe = moe_layer.MoE(8, expert, num_experts=4, k=2, min_capacity=1, capacity_factor=0.75,
                        use_residual=True)
    with torch.no_grad():  # experts start as copies: make them differ
        for p in moe.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 9, 8, requires_grad=True)
    torch.manual_seed(1)
    y, l_aux, counts = moe(x)
    torch.manual_seed(1)
    routes = moe.deepspeed_moe.gate.routes(x.reshape(-1, 8))
    assert (routes.indices < 0).any()  # some choices dropped at capacity 0.75
    tokens = x.reshape(-1, 8)
    ref = torch.zeros_like(tokens)
    for j in range(2):
        for s in range(tokens.shape[0]):
            e = int(routes.indices[j, s])
            if e >= 0:
                ref[s] += routes.gates[j, s] * moe.deepspeed_moe.experts.deepspeed_experts[e](tokens[s])
    coef = torch.softmax(moe.coefficient(tokens), -1)
    ref = ref * coef[:, :1] + expert(tokens) * coef[:, 1:]
    assert torch.allclose(y.reshape(-1, 8), ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(counts, routes.exp_counts) and torch.equal(l_aux, routes.l_aux)
    # expert parameters carry DeepSpeed's marks; the gate, the dense MLP and the mix do not
    marked = {n for n, p in moe.named_parameters() if getattr(p, "allreduce", True) is False}
    assert marked == {n for n, _ in moe.named_parameters() if ".deepspeed_experts." in n}
    assert {p.group_name for n, p in moe.named_parameters() if n in marked} == {"ep_size_1"}
    assert moe.expert_ids() == [0, 1, 2, 3]


def _peer_python():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from peers import peer_python
    finally:
        sys.path.pop(0)
    return peer_python(create=False, quiet=True)


def test_same_routing_and_layer_as_deepspeed(tmp_path, world_of_one):
    py = _peer_python()
    if py is None:
        pytest.skip("no DeepSpeed peer venv (benchmarks/peers.py; DSLAUNCH_PEER_VENV)")
    proc = subprocess.run([py, str(SCRIPTS / "moe_gate_cases.py"), "--impl", "deepspeed",
                           str(tmp_path / "ds.pt")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = torch.load(tmp_path / "ds.pt")
    spec = importlib.util.spec_from_file_location("moe_gate_cases", SCRIPTS / "moe_gate_cases.py")
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    ours = cases.run(sharded_moe, moe_layer)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        mine = ours[key]
        if value is None or mine is None:
            assert value is None and mine is None, key
        elif value.dtype.is_floating_point:
            assert torch.allclose(mine, value, rtol=1e-6, atol=1e-6), key
        else:  # routing decisions, slots, counts, capacities: exactly
            assert torch.equal(mine, value), key
