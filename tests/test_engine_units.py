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
from dslaunch.engine.comm import env_layout
from dslaunch.engine.optim import Lamb, Lion
from dslaunch.engine.optim import build_optimizer as _build_optimizer
from dslaunch.engine.optim.schedules import (LRRangeTest, OneCycle, WarmupCosineLR,
                                             WarmupDecayLR, WarmupLR, build_scheduler)
from dslaunch.engine.precision import DynamicLossScaler, build_precision


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
    params = lambda: [torch.nn.Parameter(torch.ones(3))]  # noqa: E731
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
    assert _config_source(args, {"a": 1}, None)[1] == "config="
