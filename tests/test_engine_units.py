"""Pure-logic parts of the engine: LR schedules against DeepSpeed's documented formulas, the
dynamic loss scale state machine, launcher-env discovery, optimizer construction by name,
config flags, and the no-config error."""

import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from dslaunch.config import resolve_config
from dslaunch.engine.api import _config_source, add_config_arguments
from dslaunch.engine.base.precision import DynamicLossScaler, build_precision
from dslaunch.engine.comm.collectives import env_layout
from dslaunch.engine.optim import Lamb, Lion
from dslaunch.engine.optim import build_optimizer as _build_optimizer
from dslaunch.engine.optim.schedules import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
)


def build_optimizer(params, section: dict):
    """The engine takes the typed ``optimizer`` section (``.type``, ``.params``); these tests
    write it as a dict."""
    return _build_optimizer(params, SimpleNamespace(**section))


def _opt(lr=0.01, cls=torch.optim.SGD, **kw):
    return cls([torch.nn.Parameter(torch.zeros(2))], lr=lr, **kw)


def _trace(sched, opt, n):
    """lr in force for optimizer steps 0..n-1 (the engine steps the schedule after each)."""
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        sched.step()
    return out


def test_warmup_lr_log_and_linear():
    opt = _opt()
    s = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=0.01, warmup_num_steps=4)
    got = _trace(s, opt, 6)
    # before any step: min lr; then iteration i: log(i+1)/log(4)
    want = [0.0, 0.0, 0.01 * math.log(2) / math.log(4), 0.01 * math.log(3) / math.log(4), 0.01,
            0.01]
    assert got == pytest.approx(want, abs=1e-12)
    opt = _opt()
    s = WarmupLR(opt, 0.0, 0.01, 4, warmup_type="linear")
    assert _trace(s, opt, 6) == pytest.approx([0.0, 0.0, 0.0025, 0.005, 0.0075, 0.01])


def test_warmup_lr_without_a_peak_warms_each_group_to_its_own_lr():
    """DeepSpeed 0.19.8's WarmupLR: ``warmup_max_lr`` unset is each param group's lr (older
    DeepSpeed, and dslaunch before, warmed every group to 0.001). The trace below is what
    DeepSpeed 0.19.8's own WarmupLR gave for the same two groups (peer venv, by hand); the
    config's resolved default must leave it unset, not fill 0.001."""
    ps = [torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))]
    opt = torch.optim.SGD([{"params": [ps[0]], "lr": 3e-4}, {"params": [ps[1]], "lr": 1e-4}], lr=1.0)
    cfg = resolve_config({"train_batch_size": 1, "scheduler": {
        "type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}}}).typed
    s = build_scheduler(cfg.scheduler, opt)
    got = []
    for _ in range(6):
        got.append([g["lr"] for g in opt.param_groups])
        opt.step()
        s.step()
    want = [[0.0, 0.0], [0.0, 0.0], [7.5e-05, 2.5e-05], [1.5e-4, 5e-05], [2.25e-4, 7.5e-05],
            [3e-4, 1e-4]]
    assert [lr for step in got for lr in step] == pytest.approx(
        [lr for step in want for lr in step], abs=1e-15)


def test_warmup_decay_lr():
    opt = _opt()
    s = WarmupDecayLR(opt, total_num_steps=10, warmup_max_lr=0.01, warmup_num_steps=4,
                      warmup_type="linear")
    lrs = {}
    for i in range(13):
        s.step()
        lrs[i] = opt.param_groups[0]["lr"]
    assert lrs[4] == pytest.approx(0.01)
    assert lrs[7] == pytest.approx(0.005)  # (10-7)/(10-4)
    assert lrs[10] == 0.0 and lrs[12] == 0.0


def test_warmup_cosine_lr():
    opt = _opt(lr=0.01)
    s = WarmupCosineLR(opt, total_num_steps=10, warmup_min_ratio=0.1, warmup_num_steps=4,
                       cos_min_ratio=0.2, warmup_type="linear")
    assert opt.param_groups[0]["lr"] == 0.0
    lrs = {}
    for i in range(10):
        s.step()
        lrs[i] = opt.param_groups[0]["lr"]
    assert lrs[0] == pytest.approx(0.001)
    assert lrs[2] == pytest.approx(0.01 * (0.1 + 0.5 * 0.9))
    cos = (1 + math.cos(math.pi * 1 / 6)) / 2
    assert lrs[4] == pytest.approx(0.01 * (0.2 + 0.8 * cos))
    assert lrs[9] == pytest.approx(0.002)


def test_one_cycle_lr_and_momentum():
    opt = _opt(cls=torch.optim.Adam, betas=(0.9, 0.999))
    s = OneCycle(opt, cycle_min_lr=0.001, cycle_max_lr=0.01, decay_lr_rate=0.5,
                 cycle_first_step_size=4, decay_step_size=2)
    assert opt.param_groups[0]["lr"] == 0.001 and opt.param_groups[0]["betas"][0] == 0.8
    lrs, moms = {}, {}
    for i in range(12):
        s.step()
        lrs[i], moms[i] = opt.param_groups[0]["lr"], opt.param_groups[0]["betas"]
    assert lrs[0] == pytest.approx(0.00325) and moms[0][0] == pytest.approx(0.875)
    assert moms[0][1] == 0.999
    assert lrs[3] == pytest.approx(0.01)
    assert lrs[5] == pytest.approx(0.0055)
    assert lrs[7] == pytest.approx(0.001)
    assert lrs[8] == pytest.approx(0.001 / 1.25)
    assert lrs[11] == pytest.approx(0.0005)


def test_lr_range_test():
    opt = _opt()
    s = LRRangeTest(opt, lr_range_test_min_lr=0.001, lr_range_test_step_size=2)
    assert _trace(s, opt, 5) == pytest.approx([0.001, 0.0015, 0.002, 0.0025, 0.003])
    opt = _opt()
    s = LRRangeTest(opt, 0.001, 2, lr_range_test_staircase=True)
    assert _trace(s, opt, 4) == pytest.approx([0.001, 0.001, 0.002, 0.002])


def test_schedule_state_dict_round_trip():
    opt = _opt()
    s = build_scheduler(SimpleNamespace(**{"type": "WarmupDecayLR", "params": {
        "total_num_steps": 10, "warmup_num_steps": 4, "warmup_max_lr": 0.01}}), opt)
    for _ in range(5):
        s.step()
    opt2 = _opt()
    s2 = build_scheduler(SimpleNamespace(**{"type": "WarmupDecayLR", "params": {
        "total_num_steps": 10, "warmup_num_steps": 4, "warmup_max_lr": 0.01}}), opt2)
    s2.load_state_dict(s.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    s.step(), s2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_dynamic_loss_scale_hysteresis_window_and_floor():
    s = DynamicLossScaler(init_scale=1024, scale_window=3, hysteresis=2)
    s.update(True)
    assert s.loss_scale == 1024  # first overflow only spends hysteresis
    s.update(True)
    assert s.loss_scale == 512
    for expect in (512, 512, 512, 1024):  # grows after 3 clean steps past the overflow
        s.update(False)
        assert s.loss_scale == expect
    s = DynamicLossScaler(init_scale=2, min_scale=1, hysteresis=1)
    s.update(True), s.update(True)
    assert s.loss_scale == 1
    p = _precision({"fp16": {"enabled": True, "loss_scale": 128.0}})
    assert p.scaler.loss_scale == 128 and not p.scaler.dynamic
    p = _precision({"fp16": {"enabled": True, "initial_scale_power": 5}})
    assert p.scaler.loss_scale == 32 and p.scaler.dynamic
    assert _precision({"bf16": {"enabled": True}}).dtype == torch.bfloat16


def _precision(sections: dict):
    cfg = resolve_config({"train_batch_size": 1, **sections}).typed
    return build_precision(cfg.fp16, cfg.bf16)


@pytest.mark.parametrize("env, want", [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (3, 4, 1, "RANK")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, (2, 8, 0, "OMPI_COMM_WORLD_RANK")),
    ({"PMI_RANK": "5", "PMI_SIZE": "6"}, (5, 6, 5, "PMI_RANK")),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}, (7, 8, 3, "SLURM_PROCID")),
    ({}, (0, 1, 0, "none")),
])
def test_env_layout(env, want):
    assert env_layout(env) == want


def test_build_optimizer_by_name():
    params = lambda: [torch.nn.Parameter(torch.ones(3))]
    adam = build_optimizer(params(), {"type": "Adam", "params": {"lr": 1e-3}})
    assert isinstance(adam, torch.optim.AdamW)  # DeepSpeed: adam_w_mode defaults to true
    assert adam.defaults["fused"] is True
    l2 = build_optimizer(params(), {"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}})
    assert type(l2) is torch.optim.Adam
    assert isinstance(build_optimizer(params(), {"type": "lamb", "params": {"lr": 1e-3}}), Lamb)
    assert isinstance(build_optimizer(params(), {"type": "Lion", "params": {"lr": 1e-4}}), Lion)
    assert isinstance(build_optimizer(params(), {"type": "RMSprop", "params": {"lr": 1e-2}}),
                      torch.optim.RMSprop)
    with pytest.raises(ValueError, match="unknown optimizer 'Nope'"):
        build_optimizer(params(), {"type": "Nope", "params": {}})


def test_build_optimizer_defaults_are_deepspeeds():
    """What a config leaves out is what DeepSpeed 0.19.8 uses: its FusedAdam / DeepSpeedCPUAdam
    do not decay weights unless told (torch's AdamW would by 0.01; a ported config without
    weight_decay trained differently, found by bench_train's loss check against DDP), and its
    Lion defaults to lr 1e-3, betas (0.9, 0.999). ``torch_adam: true`` hands the params to torch's
    class in DeepSpeed, so torch's defaults hold there."""
    params = lambda: [torch.nn.Parameter(torch.ones(3))]
    for kind in ("Adam", "AdamW", "FusedAdam", "CPUAdam"):
        opt = build_optimizer(params(), {"type": kind, "params": {"lr": 1e-3}})
        assert opt.defaults["weight_decay"] == 0.0, kind
    told = build_optimizer(params(), {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}})
    assert told.defaults["weight_decay"] == 0.1
    torch_adam = build_optimizer(params(), {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}})
    assert type(torch_adam) is torch.optim.AdamW and torch_adam.defaults["weight_decay"] == 0.01
    lion = build_optimizer(params(), {"type": "Lion", "params": {}})
    assert (lion.defaults["lr"], lion.defaults["betas"], lion.defaults["weight_decay"]) == \
        (1e-3, (0.9, 0.999), 0.0)


@pytest.mark.parametrize("name, lr", [("Lamb", 0.05), ("Lion", 0.05), ("SGD", 0.05),
                                      ("Adagrad", 0.5)])
def test_small_optimizers_reduce_a_quadratic(name, lr):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8))
    opt = build_optimizer([w], {"type": name, "params": {"lr": lr}})
    start = (w.detach() ** 2).sum().item()
    for _ in range(20):
        opt.zero_grad()
        (w ** 2).sum().backward()
        opt.step()
    assert (w.detach() ** 2).sum().item() < 0.5 * start


# -- Lamb and Lion against the published algorithms, step by step ---------------------------------
#
# Each step starts the reference (float64, written from the papers) from the optimizer's own
# parameters and state before that step, then compares the update it made (p_after - p_before)
# and the new state. Tolerance: rtol 1e-5 on the update, plus float32's rounding of the stored
# parameter (8 ulp of its largest element) as atol, and likewise for the moments (8 ulp of the
# larger of the old moment and the gradient, squared for exp_avg_sq); a wrong formula is off by
# far more (the checker must fail on every perturbed variant in
# test_reference_check_catches_a_wrong_update). Measured (torch 2.13, CPU): the largest deviation
# of Lamb / Lion is 0.06 / 0.12 of the tolerance; the perturbed variants exceed it 73x (Lamb
# without bias correction) to 85,000x (Lion with its betas swapped).

def _lamb_ref(p, g, state, h):
    """One LAMB step (You et al., 2019, Algorithm 2) with DeepSpeed's knobs: Adam moments, bias
    correction, r = m^/(sqrt(v^)+eps) + wd*p, trust ratio ||p||/||r|| clamped to
    [min_coeff, max_coeff] (1 when either norm is 0), p -= lr * trust * r."""
    b1, b2 = h["betas"]
    t = int(state["step"]) + 1
    m = b1 * state["exp_avg"] + (1 - b1) * g
    v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
    mh, vh = (m / (1 - b1 ** t), v / (1 - b2 ** t)) if h["bias_correction"] else (m, v)
    r = mh / (vh.sqrt() + h["eps"]) + h["weight_decay"] * p
    pn, rn = p.norm().item(), r.norm().item()
    trust = min(max(pn / rn, h["min_coeff"]), h["max_coeff"]) if pn > 0 and rn > 0 else 1.0
    return p - h["lr"] * trust * r, {"step": t, "exp_avg": m, "exp_avg_sq": v}


def _lion_ref(p, g, state, h):
    """One Lion step (Chen et al., 2023, Program 1): c = b1*m + (1-b1)*g,
    p -= lr * (sign(c) + wd*p), then m = b2*m + (1-b2)*g."""
    b1, b2 = h["betas"]
    c = b1 * state["exp_avg"] + (1 - b1) * g
    p = p - h["lr"] * (torch.sign(c) + h["weight_decay"] * p)
    return p, {"exp_avg": b2 * state["exp_avg"] + (1 - b2) * g}


LAMB_GROUPS = [dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                    bias_correction=True, max_coeff=10.0, min_coeff=0.01),
               dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0,
                    bias_correction=False, max_coeff=5.0, min_coeff=0.1)]
LION_GROUPS = [dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1),
               dict(lr=3e-3, betas=(0.95, 0.98), weight_decay=0.0)]


def _params():
    """Per group: an ordinary tensor, one so large its trust ratio clamps at max_coeff, one so
    small it clamps at min_coeff, and one all zeros (trust 1 on the first step)."""
    g = torch.Generator().manual_seed(0)
    return [[torch.nn.Parameter(torch.randn(4, 5, generator=g)),
             torch.nn.Parameter(100 * torch.randn(7, generator=g)),
             torch.nn.Parameter(1e-4 * torch.randn(6, generator=g)),
             torch.nn.Parameter(torch.zeros(3))] for _ in range(2)]


def _check_against_reference(cls, opt_groups, ref_groups, ref_step, steps=8):
    """Raise AssertionError where ``cls`` built with ``opt_groups`` does not step as ``ref_step``
    with ``ref_groups`` does (random gradients, every step checked)."""
    params = _params()
    opt = cls([dict(params=ps, **h) for ps, h in zip(params, opt_groups)])
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        before = {}
        for ps in params:
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
                st = {k: (v.double().clone() if v.dim() else v.item())
                      for k, v in opt.state[p].items()}
                if not st:  # a fresh state: zeros, step 0
                    st = {"step": 0, "exp_avg": torch.zeros_like(p, dtype=torch.float64),
                          "exp_avg_sq": torch.zeros_like(p, dtype=torch.float64)}
                before[p] = (p.detach().double().clone(), st)
        opt.step()
        for gi, (ps, h) in enumerate(zip(params, ref_groups)):
            for pi, p in enumerate(ps):
                p0, st = before[p]
                want_p, want_state = ref_step(p0, p.grad.double(), st, h)
                where = f"step {step}, group {gi}, param {pi}"
                atol = 8 * torch.finfo(torch.float32).eps * max(p0.abs().max().item(), 1e-30)
                torch.testing.assert_close(
                    p.detach().double() - p0, want_p - p0, rtol=1e-5, atol=atol,
                    msg=lambda m, where=where: f"{where}: update: {m}")
                for k, want in want_state.items():
                    got = opt.state[p][k]
                    if isinstance(want, int):
                        assert float(got) == want, (where, k, got, want)
                    else:  # float32 rounding of b*state + (1-b)*g (or g*g): 8 ulp of the terms
                        scale = max(st[k].abs().max().item(),
                                    p.grad.abs().max().item() ** (2 if k == "exp_avg_sq" else 1))
                        torch.testing.assert_close(
                            got.double(), want, rtol=1e-5,
                            atol=8 * torch.finfo(torch.float32).eps * scale,
                            msg=lambda m, k=k, where=where: f"{where}: {k}: {m}")


def test_lamb_steps_like_the_published_algorithm():
    _check_against_reference(Lamb, LAMB_GROUPS, LAMB_GROUPS, _lamb_ref)


def test_lion_steps_like_the_published_algorithm():
    _check_against_reference(Lion, LION_GROUPS, LION_GROUPS, _lion_ref)


def test_reference_parameters_hit_both_trust_clamps():
    """The LAMB check covers the clamp: on the first step the large tensor's ratio is above
    max_coeff and the small one's below min_coeff, in both groups."""
    for ps, h in zip(_params(), LAMB_GROUPS):
        for p, clamp in ((ps[1], "max_coeff"), (ps[2], "min_coeff")):
            ratio = p.norm().item() / (torch.ones_like(p) + h["weight_decay"] * p).norm().item()
            assert (ratio > h["max_coeff"]) if clamp == "max_coeff" else (ratio < h["min_coeff"])


class _LionMomentumFirst(Lion):
    """A plausible wrong Lion: the momentum updated before the sign is taken (Adam's order)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_((m * b1).add_(p.grad, alpha=1 - b1).sign_(), alpha=-group["lr"])


@pytest.mark.parametrize("cls, change, ref_step, groups", [
    (Lamb, {"bias_correction": False}, _lamb_ref, LAMB_GROUPS),
    (Lamb, {"max_coeff": 20.0}, _lamb_ref, LAMB_GROUPS),
    (Lamb, {"min_coeff": 0.001}, _lamb_ref, LAMB_GROUPS),
    (Lamb, {"weight_decay": 0.02}, _lamb_ref, LAMB_GROUPS),
    (Lamb, {"betas": (0.9, 0.99)}, _lamb_ref, LAMB_GROUPS),
    (Lion, {"weight_decay": 0.2}, _lion_ref, LION_GROUPS),
    (Lion, {"betas": (0.99, 0.9)}, _lion_ref, LION_GROUPS),
    (_LionMomentumFirst, {}, _lion_ref, LION_GROUPS),
])
def test_reference_check_catches_a_wrong_update(cls, change, ref_step, groups):
    """The step-by-step check is not vacuous: an optimizer that differs from what the reference
    is told in one knob (or in the order of Lion's two momentum uses) fails it."""
    wrong = [dict(h, **change) for h in groups]
    with pytest.raises(AssertionError):
        _check_against_reference(cls, wrong, groups, ref_step)


def test_add_config_arguments():
    p = add_config_arguments(argparse.ArgumentParser())
    a = p.parse_args(["--deepspeed", "--config", "c.json", "--local_rank", "0"])
    assert a.deepspeed and a.deepspeed_config == "c.json" and a.local_rank == 0
    own = argparse.ArgumentParser()
    own.add_argument("--config")
    own.add_argument("--local_rank", type=int)
    a = add_config_arguments(own).parse_args(["--config", "x", "--deepspeed_config", "y"])
    assert a.config == "x" and a.deepspeed_config == "y"


def test_config_source_order_and_missing(monkeypatch):
    monkeypatch.delenv("DSLAUNCH_CONFIG", raising=False)
    with pytest.raises(ValueError, match="no config"):
        _config_source(None, None, None)
    monkeypatch.setenv("DSLAUNCH_CONFIG", '{"train_batch_size": 1}')
    assert _config_source(None, None, None)[1] == "DSLAUNCH_CONFIG"
    args = argparse.Namespace(deepspeed_config="f.json")
    assert _config_source(args, None, None) == ("f.json", "args.deepspeed_config")
    assert _config_source({"deepspeed_config": "f.json"}, None, None)[0] == "f.json"  # a dict
    assert _config_source(None, None, {"a": 1}) == ({"a": 1}, "config_params=")
    assert _config_source(argparse.Namespace(deepspeed_config=None), {"a": 1}, None)[1] == \
        "config="
    with pytest.raises(ValueError, match="config is given twice"):  # as DeepSpeed refuses
        _config_source(args, {"a": 1}, None)
