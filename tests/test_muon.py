"""Muon (``optimizer.type: Muon``, dslaunch/engine/optim/muon.py), one process.

The reference below is written from the math of DeepSpeed's Muon (MuonWithAuxAdam, 0.18+), in
float64, not from its code:

  Muon half (use_muon: >= 2-D, name without "embed" / "lm_head"), per matrix G with momentum M:
    M <- beta M + (1 - beta) G;  U <- (1 - beta) G + beta M  (nesterov; M without)
    X <- U / (||U||_F + 1e-7), transposed when rows > cols;  5 times:
      A = X X^T;  X <- 3.4445 X + (-4.7750 A + 2.0315 A A) X
    O <- X (transposed back) * sqrt(max(1, rows / cols));  W <- W (1 - lr wd) - lr O
  AdamW half: m, v as Adam, W <- W (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Agreement measured here (6 steps, 3 matrices (tall, wide, square), a bias, an embedding, a
lm_head): float64 parameters with ``ns_dtype: fp64`` equal the reference to 1e-12 relative
(both ns_method "gram" and "standard"; measured 7.9e-16); float32 parameters with the iteration
in fp32 to 2e-5 (measured 2.9e-7).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from dslaunch.config import resolve_config
from dslaunch.config.errors import ConfigError
from dslaunch.engine.optim import build_optimizer
from dslaunch.engine.optim.muon import Muon, build_muon, tag_muon_params
from dslaunch.engine.optim.newton_schulz import newton_schulz

A, B, C = 3.4445, -4.7750, 2.0315


def ref_ns(G, steps=5):
    X = G / (G.norm() + 1e-7)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        Am = X @ X.T
        X = A * X + (B * Am + C * Am @ Am) @ X
    return X.T if tall else X


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6, dtype=dtype)
        self.up = torch.nn.Linear(6, 14, dtype=dtype)  # weight 14x6 (tall) and a bias
        self.down = torch.nn.Linear(14, 6, bias=False, dtype=dtype)  # 6x14 (wide)
        self.mix = torch.nn.Linear(8, 8, bias=False, dtype=dtype)  # square
        self.lm_head = torch.nn.Linear(6, 10, bias=False, dtype=dtype)


PARAMS = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1, "adam_lr": 0.01,
          "betas": (0.8, 0.95), "eps": 1e-8}


def ref_run(model, steps, grads, params, nesterov=True, ns_steps=5):
    """The float64 reference over ``steps`` steps; returns the weights after each step."""
    W = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    state = {n: {} for n in W}
    history = []
    for t in range(1, steps + 1):
        for n, w in W.items():
            g = grads[t - 1][n]
            st = state[n]
            if w.ndim >= 2 and "embed" not in n and "lm_head" not in n:
                lr, beta, wd = params["lr"], params["momentum"], params["weight_decay"]
                M = st.setdefault("M", torch.zeros_like(w))
                M.mul_(beta).add_((1 - beta) * g)
                U = (1 - beta) * g + beta * M if nesterov else M
                orth = ref_ns(U, ns_steps) * math.sqrt(max(1.0, w.shape[0] / w.shape[1]))
                W[n] = w * (1 - lr * wd) - lr * orth
            else:
                lr, (b1, b2), eps, wd = params["adam_lr"], params["betas"], params["eps"], \
                    params["weight_decay"]
                m = st.setdefault("m", torch.zeros_like(w))
                v = st.setdefault("v", torch.zeros_like(w))
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                upd = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
                W[n] = w * (1 - lr * wd) - lr * upd
        history.append({n: w.clone() for n, w in W.items()})
    return history


def random_grads(model, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(p.shape, generator=gen, dtype=torch.float64)
             for n, p in model.named_parameters()} for _ in range(steps)]


def run_ours(model, steps, grads, params):
    opt = build_muon(model.parameters(), params, model)
    history = []
    for t in range(steps):
        for n, p in model.named_parameters():
            p.grad = grads[t][n].to(p.dtype)
        opt.step()
        history.append({n: p.detach().double().clone() for n, p in model.named_parameters()})
    return opt, history


def max_rel(ours, ref):
    return max(((ours[n] - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref)


@pytest.mark.parametrize("method", ["gram", "standard"])
def test_float64_equals_reference_step_by_step(method):
    torch.manual_seed(0)
    model = Net(torch.float64)
    steps = 6
    grads = random_grads(model, steps)
    ref = ref_run(model, steps, grads, PARAMS)
    _, ours = run_ours(model, steps, grads, {**PARAMS, "ns_method": method, "ns_dtype": "fp64"})
    for t in range(steps):
        assert max_rel(ours[t], ref[t]) < 1e-12, (t, max_rel(ours[t], ref[t]))
    # the steps moved the weights by far more than the tolerance
    start = {n: p.detach() for n, p in Net(torch.float64).named_parameters()}
    assert max_rel(ref[-1], start) > 1e-2


def test_float32_within_2e5_of_float64_reference():
    torch.manual_seed(0)
    model = Net(torch.float32)
    steps = 6
    grads = random_grads(model, steps)
    ref = ref_run(model, steps, grads, PARAMS)
    _, ours = run_ours(model, steps, grads, {**PARAMS, "ns_dtype": "fp32"})
    worst = max(max_rel(o, r) for o, r in zip(ours, ref))
    assert worst < 2e-5, worst


def test_without_nesterov_and_three_iterations():
    torch.manual_seed(0)
    model = Net(torch.float64)
    grads = random_grads(model, 3, seed=5)
    ref = ref_run(model, 3, grads, PARAMS, nesterov=False, ns_steps=3)
    _, ours = run_ours(model, 3, grads, {**PARAMS, "nesterov": False, "ns_steps": 3,
                                          "ns_dtype": "fp64"})
    assert max_rel(ours[-1], ref[-1]) < 1e-12
    other = ref_run(model, 3, grads, PARAMS)  # nesterov, 5 iterations: a different result
    assert max_rel(ours[-1], other[-1]) > 1e-4


def test_split_follows_deepspeeds_rule_and_settings():
    model = Net(torch.float32)
    tag_muon_params(model)
    muon = {n for n, p in model.named_parameters() if p.use_muon}
    assert muon == {"up.weight", "down.weight", "mix.weight"}
    opt = build_muon(model.parameters(), {"lr": 0.1, "adam_lr": 0.002, "weight_decay": 0.01}, model)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert set(by_name) == {"muon-params", "adam-params"}
    m, a = by_name["muon-params"], by_name["adam-params"]
    assert (m["lr"], m["momentum"], m["ns_method"], m["ns_steps"], m["nesterov"]) == \
        (0.1, 0.95, "gram", 5, True)
    assert (a["lr"], a["betas"], a["eps"], a["weight_decay"]) == (0.002, (0.9, 0.95), 1e-10, 0.01)
    # param groups keep their own settings, per half
    groups = [{"params": [model.up.weight, model.up.bias], "weight_decay": 0.0},
              {"params": [model.down.weight, model.mix.weight, model.embed.weight,
                          model.lm_head.weight], "lr": 0.3}]
    opt = build_muon(groups, {"lr": 0.1, "weight_decay": 0.01}, model)
    got = {g["name"]: (len(g["params"]), g["lr"], g["weight_decay"]) for g in opt.param_groups}
    assert got == {"group0-muon-params": (1, 0.1, 0.0), "group0-adam-params": (1, 0.1, 0.0),
                   "group1-muon-params": (2, 0.3, 0.01), "group1-adam-params": (2, 0.3, 0.01)}


def test_config_type_muon_builds_it_and_rejects_per_head():
    cfg = resolve_config({"train_micro_batch_size_per_gpu": 1,
                          "optimizer": {"type": "muon", "params": {"lr": 0.01,
                                                                   "ns_method": "standard"}}},
                         world_size=1).typed
    assert cfg.optimizer.type == "Muon"
    model = Net(torch.float32)
    opt = build_optimizer(model.parameters(), cfg.optimizer, model=model)
    assert isinstance(opt, Muon)
    assert {g["ns_method"] for g in opt.param_groups if g["use_muon"]} == {"standard"}
    bad = types.SimpleNamespace(type="Muon", params={"per_head_muon": True})
    with pytest.raises(ValueError, match="per_head_muon"):
        build_optimizer(model.parameters(), bad, model=model)
    with pytest.raises(ValueError, match="use_muon"):
        build_optimizer(Net(torch.float32).parameters(), cfg.optimizer)  # untagged, no model
    with pytest.raises(ConfigError, match="ns_method"):
        resolve_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {
            "type": "Muon", "params": {"ns_method": "cubic"}}}, world_size=1)


def test_newton_schulz_orthogonalizes_and_gram_matches_standard_in_fp32():
    torch.manual_seed(3)
    G = torch.randn(32, 96)
    X = newton_schulz(G, 5, "gram", torch.float32)
    Y = newton_schulz(G, 5, "standard", torch.float32)
    assert (X - Y).abs().max() < 1e-5
    s = torch.linalg.svdvals(X.double())
    assert s.min() > 0.5 and s.max() < 1.3  # DeepSpeed's iteration: singular values ~U(0.5, 1.5)
