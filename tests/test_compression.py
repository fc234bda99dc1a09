"""Compression training (issue 34 part 3; DeepSpeed 0.18's deepspeed.compression): weight
quantization values and bit schedule, sparse / row / head pruning masks, redundancy_clean shrinking
the model with the same outputs, the engine stepping the schedule, and the config section's
errors. DeepSpeed 0.18.9's own values are compared by benchmarks/compare_compression_ds018.py
(needs a DeepSpeed 0.18 venv; not in CI)."""

import json
import math
import re

import pytest
import torch
from torch import nn

import dslaunch
from dslaunch.config import resolve_config
from dslaunch.config.errors import ConfigError
from dslaunch.engine.features.compression import (
    LinearLayer_Compress,
    compression_scheduler,
    init_compression,
    quantize,
    redundancy_clean,
    scheduled_bits,
)
from helpers import ROOT, launch


class Block(nn.Module):
    """An attention-like block: q/k/v, an output projection o, an MLP fc1 -> fc2."""

    def __init__(self, width=16, hidden=32):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        h = self.o(self.q(x) * self.k(x) + self.v(x))
        return self.fc2(torch.relu(self.fc1(h)))


def _section(**methods):
    return {"compression_training": methods}


def _method(params, modules, related=None, **shared):
    group = {"params": params, "modules": modules}
    if related is not None:
        group["related_modules"] = related
    return {"shared_parameters": {"enabled": True, "schedule_offset": 0, **shared},
            "different_groups": {"g1": group}}


@pytest.mark.parametrize("kind", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("bits", [3, 4, 8])
def test_quantized_values_per_group_at_most_2_pow_bits(kind, bits):
    torch.manual_seed(0)
    w = torch.randn(64, 48)
    q = quantize(w, bits, groups=4, kind=kind)
    for group in q.reshape(4, -1):
        assert 2 < group.unique().numel() <= 2 ** bits
    assert (q - w).abs().max() <= 2 * (w.max() - w.min()) / 2 ** bits  # within a step or two
    # ternary and binary: 3 and 2 values
    assert quantize(w, 2).unique().numel() == 3 and quantize(w, 1).unique().numel() == 2


def test_bit_schedule_follows_start_target_period():
    # MoQ's rule: one bit less at P, 2P, 4P ... steps after the offset, never below target
    assert [scheduled_bits(8, 4, 2, k) for k in range(0, 18)] == \
        [8, 8, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 5, 5, 5, 5, 4, 4]
    assert scheduled_bits(8, 4, 2, 10_000) == 4
    model = Block()
    cfg = _section(weight_quantization=_method(
        {"start_bits": 6, "target_bits": 3, "quantization_period": 1}, ["fc1"],
        schedule_offset=2, quantize_weight_in_forward=True))
    init_compression(model, cfg)
    sched = compression_scheduler(model, cfg)
    seen = []
    for _ in range(8):
        sched.step()
        seen.append((model.fc1.weight_quantization_enabled, model.fc1.weight.start_bits))
    assert seen == [(False, 6), (True, 6), (True, 5), (True, 4), (True, 4), (True, 3), (True, 3),
                    (True, 3)]
    x = torch.randn(5, 16)
    sched.training_steps = 100
    sched.step()
    assert model.fc1.weight.start_bits == 3
    weight, _ = model.fc1.compressed_weight_and_bias()
    assert weight.unique().numel() <= 2 ** 3
    model.fc1(x).sum().backward()  # straight-through gradient reaches the fp32 weight
    assert model.fc1.weight.grad is not None and model.fc1.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["l1", "topk"])
def test_pruned_rows_heads_and_sparse_values_are_zero(method):
    torch.manual_seed(1)
    model = Block()
    cfg = _section(
        sparse_pruning=_method({"dense_ratio": 0.3}, ["q"], method=method),
        row_pruning=_method({"dense_ratio": 0.25}, ["fc1"], method=method),
        head_pruning=_method({"dense_ratio": 0.5}, ["o"], method=method, num_heads=4))
    init_compression(model, cfg)
    assert all(isinstance(getattr(model, n), LinearLayer_Compress) for n in ("q", "fc1", "o"))
    assert isinstance(model.k, nn.Linear) and not isinstance(model.k, LinearLayer_Compress)
    compression_scheduler(model, cfg).step(step_zero_check=True)
    w, _ = model.q.compressed_weight_and_bias()
    assert (w != 0).sum().item() == math.ceil(0.3 * w.numel())
    if method == "l1":  # the kept ones are the largest |w|
        kept = model.q.weight.detach().abs()[w != 0]
        assert kept.min() >= model.q.weight.detach().abs()[w == 0].max()
    w, b = model.fc1.compressed_weight_and_bias()
    zero_rows = (w == 0).all(dim=1)
    assert zero_rows.sum().item() == 32 - 8 and (b[zero_rows] == 0).all()
    w, _ = model.o.compressed_weight_and_bias()
    zero_heads = (w.t().reshape(4, -1) == 0).all(dim=1)
    assert zero_heads.sum().item() == 2


@pytest.mark.parametrize("method", ["l1", "topk"])
def test_redundancy_clean_shrinks_and_keeps_outputs(method):
    torch.manual_seed(2)
    model = Block()
    cfg = _section(
        sparse_pruning=_method({"dense_ratio": 0.5}, ["v"], method=method),
        row_pruning=_method({"dense_ratio": 0.5}, ["fc1"], [["fc2"]], method=method),
        head_pruning=_method({"dense_ratio": 0.5}, ["o"], [["q", "k", "v"]], method=method,
                             num_heads=4))
    init_compression(model, cfg)
    compression_scheduler(model, cfg).step(step_zero_check=True)
    x = torch.randn(7, 16)
    with torch.no_grad():
        masked = model(x)
    before = sum(p.numel() for p in model.parameters() if p.requires_grad)
    dense = sum(p.numel() for n, p in model.named_parameters() if "scores" not in n)
    redundancy_clean(model, cfg)
    after = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        cleaned = model(x)
    assert torch.allclose(cleaned, masked, atol=1e-6, rtol=0)
    assert after < dense <= before
    assert (model.fc1.out_features, model.fc2.in_features) == (16, 16)
    assert model.q.weight.shape == (8, 16) and model.o.weight.shape == (16, 8)
    assert tuple(model.fc2.weight.shape) == (16, 16)


def test_engine_steps_the_schedule():
    torch.manual_seed(3)
    model = Block()
    cfg = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
           **_section(
               weight_quantization=_method({"start_bits": 8, "target_bits": 4,
                                            "quantization_period": 1}, ["fc2"],
                                           schedule_offset=1, quantize_groups=2),
               row_pruning=_method({"dense_ratio": 0.5}, ["fc1"], schedule_offset=2))}
    init_compression(model, cfg)
    engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert engine.compression_scheduler is not None
    for _ in range(6):
        loss = engine(torch.randn(2, 16)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    sched = engine.compression_scheduler
    assert sched.training_steps == 6 and model.fc1.row_pruning_enabled
    bits = model.fc2.weight.start_bits
    assert bits == scheduled_bits(8, 4, 1, 5) == 5
    for group in model.fc2.weight.detach().reshape(2, -1):  # MoQ: the weight itself quantized
        assert group.unique().numel() <= 2 ** bits
    w, _ = model.fc1.compressed_weight_and_bias()
    assert (w == 0).all(dim=1).sum().item() == 16
    # a resumed engine (global_steps from a checkpoint) resumes the schedule at its step
    sched.training_steps = 0
    engine.global_steps = 40
    engine(torch.randn(2, 16))
    assert sched.training_steps == 40 and model.fc2.weight.start_bits == 4


def test_section_errors_and_refusals():
    base = {"train_batch_size": 4}
    resolve_config({**base, **_section(row_pruning=_method({"dense_ratio": 0.5}, ["fc"]))},
                   world_size=1)
    bad = [
        (_section(row_pruning=_method({"dense_ratio": 1.5}, ["fc"])), "dense_ratio"),
        (_section(weight_quantization=_method({"start_bits": 4, "target_bits": 8}, ["fc"])),
         "target_bits"),
        (_section(weight_quantization=_method({"start_bits": 8, "target_bits": 4}, ["fc"],
                                              rounding="up")), "rounding"),
        (_section(weight_quantization=_method(
            {"start_bits": 8, "target_bits": 4}, ["fc"],
            fp16_mixed_quantize={"enabled": True})), "fp16_mixed_quantize: not supported yet"),
        (_section(layer_reduction={"enabled": True, "keep_number_layer": 2}),
         "layer_reduction: needs module_name_prefix"),
        (_section(activation_quantization=_method({"bits": 6}, ["fc"])), "bits: 4 or 8"),
        (_section(sparse_pruning=_method({"dense_ratio": 0.5}, ["fc"], method="snip_momentum")),
         "snip_momentum"),
        (_section(row_pruning={"shared_parameters": {"enabled": True, "typo": 1}}), "typo"),
    ]
    for section, words in bad:
        with pytest.raises(ConfigError, match=words):
            resolve_config({**base, **section}, world_size=1)
    # present but disabled: fine
    resolve_config({**base, **_section(channel_pruning={"shared_parameters": {"enabled": False}})},
                   world_size=1)


@pytest.mark.parametrize("calibration", ["dynamic", "static"])
def test_activation_quantization(calibration):
    torch.manual_seed(4)
    model = Block()
    cfg = _section(activation_quantization=_method({"bits": 4}, ["fc2"],
                                                   range_calibration=calibration))
    init_compression(model, cfg)
    compression_scheduler(model, cfg).step(step_zero_check=True)
    seen = []
    model.fc2.register_forward_hook(lambda m, args, out: seen.append(m.quantize_input(args[0])))
    x = torch.randn(6, 16)
    model(x).sum().backward()
    quantized = seen[0].detach()
    rows = quantized if calibration == "dynamic" else quantized.reshape(1, -1)
    for row in rows:  # per token (dynamic) or over the running range (static)
        assert row.unique().numel() <= 2 ** 4
    if calibration == "static":
        low, high = model.fc2.activation_quantizer.x_min_max
        assert low < 0 <= high or low <= 0 < high
    assert model.fc1.weight.grad is not None  # straight through to the layers before


def test_layer_reduction_takes_the_teachers_layers():
    torch.manual_seed(5)

    class Stack(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.embed = nn.Linear(8, 8)
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(n))

    teacher, student = Stack(4), Stack(2)
    cfg = _section(layer_reduction={"enabled": True, "keep_number_layer": 2,
                                    "module_name_prefix": "layers", "teacher_layer": [1, 3],
                                    "other_module_name": ["embed"]})
    with pytest.raises(ValueError, match="teacher_model"):
        init_compression(student, cfg)
    init_compression(student, cfg, teacher_model=teacher)
    for s_name, t_name in (("layers.0", "layers.1"), ("layers.1", "layers.3"), ("embed", "embed")):
        assert torch.equal(student.get_submodule(s_name).weight, teacher.get_submodule(t_name).weight)


@pytest.mark.parametrize("method", ["l1", "topk"])
def test_channel_pruning_and_redundancy_clean(method):
    torch.manual_seed(6)
    net = nn.Sequential()
    net.add_module("conv1", nn.Conv2d(3, 8, 3, padding=1))
    net.add_module("relu", nn.ReLU())
    net.add_module("conv2", nn.Conv2d(8, 4, 3))
    cfg = _section(channel_pruning=_method({"dense_ratio": 0.5}, ["conv1"], [["conv2"]],
                                           method=method))
    init_compression(net, cfg)
    compression_scheduler(net, cfg).step(step_zero_check=True)
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        masked = net(x)
        pruned = (net.conv1(x) == 0).all(dim=(0, 2, 3))
    assert pruned.sum().item() == 4  # 4 of 8 output channels are zero
    redundancy_clean(net, cfg)
    with torch.no_grad():
        cleaned = net(x)
    assert net.conv1.weight.shape[0] == 4 and net.conv2.weight.shape[1] == 4
    assert torch.allclose(cleaned, masked, atol=1e-6, rtol=0)
    # a related BatchNorm2d loses the same channels
    bn_net = nn.Sequential()
    bn_net.add_module("conv1", nn.Conv2d(3, 8, 3))
    bn_net.add_module("bn", nn.BatchNorm2d(8))
    cfg = _section(channel_pruning=_method({"dense_ratio": 0.25}, ["conv1"], [["bn"]]))
    init_compression(bn_net, cfg)
    redundancy_clean(bn_net, cfg)
    assert bn_net.bn.weight.shape == (2,) and bn_net.bn.running_mean.shape == (2,)
    assert bn_net(torch.randn(2, 3, 5, 5)).shape == (2, 2, 3, 3)


def test_deepspeed_spelling_reaches_it():
    from dslaunch.compression import compress
    from dslaunch.compression import init_compression as face_init
    from dslaunch.compression import redundancy_clean as rc
    assert face_init is init_compression and rc is redundancy_clean
    assert compress.init_compression is init_compression


def test_example_config_trains_two_ranks(tmp_path):
    """configs/compression_gpt.json end to end: examples/train_gpt.py under `dslaunch run` on 2
    ranks switches weight quantization on at step 10 and the three prunings at step 20."""
    config = json.loads((ROOT / "configs" / "compression_gpt.json").read_text())
    proc = launch(tmp_path, config, ROOT / "examples" / "train_gpt.py",
                  ["--steps", "21", "--log-every", "10", "--n-layer", "1", "--d-model", "64",
                   "--data-bytes", "200000"], nproc=2)
    enabled = dict(re.findall(r"compression: (\w+) is enabled at step (\d+)", proc.stdout))
    assert enabled == {"weight_quantization": "10", "sparse_pruning": "20", "row_pruning": "20",
                       "head_pruning": "20"}, proc.stdout[-2000:]
    assert "done: 21 steps" in proc.stdout
