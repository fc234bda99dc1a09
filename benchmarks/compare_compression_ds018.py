"""One-off check (not in CI): dslaunch's compression values equal DeepSpeed 0.18.9's on the same
weights. DeepSpeed 0.19 removed deepspeed.compression, so the peer is a 0.18 venv:

    .venv/bin/python benchmarks/compare_compression_ds018.py --peer /tmp/ds018/bin/python

The script runs itself under the peer's interpreter (``--side deepspeed``) on the same state dict
and inputs, then compares: the quantizers (symmetric / asymmetric 3, 4, 8 bits; ternary; binary;
1 and 4 groups), the top-k binarizer, a model's l1 sparse / row masks and topk head masks (the
learned scores copied from DeepSpeed's model), the masked forward (with 8-bit dynamic activation
quantization of fc1's input), and after redundancy_clean the shapes and outputs; a Conv2d's topk
channel-pruning mask and outputs before and after redundancy_clean.
Prints one JSON line: the largest absolute difference of each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width=32, hidden=64):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        h = self.o(self.q(x) * self.k(x) + self.v(x))
        return self.fc2(torch.relu(self.fc1(h)))


def _method(params, modules, related=None, **shared):
    group = {"params": params, "modules": modules}
    if related is not None:
        group["related_modules"] = related
    return {"shared_parameters": {"enabled": True, "schedule_offset": 0, **shared},
            "different_groups": {"g1": group}}


CONFIG = {"compression_training": {
    "weight_quantization": _method({"start_bits": 4, "target_bits": 4, "quantization_period": 1},
                                   ["fc2"], quantize_weight_in_forward=True, quantize_groups=4),
    "activation_quantization": _method({"bits": 8}, ["fc1"], range_calibration="dynamic"),
    "sparse_pruning": _method({"dense_ratio": 0.4}, ["v"], method="l1"),
    "row_pruning": _method({"dense_ratio": 0.5}, ["fc1"], [["fc2"]], method="l1"),
    "head_pruning": _method({"dense_ratio": 0.5}, ["o"], [["q", "k", "v"]], method="topk",
                            num_heads=4),
}}
CONV_CONFIG = {"compression_training": {
    # topk: DeepSpeed 0.18.9's l1 channel mask calls torch.norm(p=1) over 3 dims, which torch 2.13
    # refuses ("linalg.norm: If dim is specified, it must be of length 1 or 2")
    "channel_pruning": _method({"dense_ratio": 0.5}, ["conv1"], [["conv2"]], method="topk")}}


def conv_net():
    net = nn.Sequential()
    net.add_module("conv1", nn.Conv2d(3, 8, 3, padding=1))
    net.add_module("relu", nn.ReLU())
    net.add_module("conv2", nn.Conv2d(8, 4, 3))
    return net


QUANT_CASES = [(kind, bits, groups) for kind in ("symmetric", "asymmetric") for bits in (3, 4, 8)
               for groups in (1, 4)] + [("ternary", 2, 1), ("ternary", 2, 4), ("binary", 1, 1),
                                         ("binary", 1, 4)]


def deepspeed_side(inputs: dict) -> dict:
    from deepspeed.compression.compress import init_compression, redundancy_clean
    from deepspeed.compression.utils import (
        AsymQuantizer,
        BinaryQuantizer,
        SymQuantizer,
        TernaryQuantizer,
        TopKBinarizer,
    )
    fn = {"symmetric": SymQuantizer, "asymmetric": AsymQuantizer, "ternary": TernaryQuantizer,
          "binary": BinaryQuantizer}
    w = inputs["w"]
    out = {f"q/{k}/{b}/{g}": fn[k].apply(w, b, None, None, g) for k, b, g in QUANT_CASES}
    out["topk"] = TopKBinarizer.apply(w.abs(), 0.3, False)
    model = Block()
    model.load_state_dict(inputs["state"])
    init_compression(model, CONFIG)
    # DeepSpeed 0.18.9's scheduler fails here (KeyError 'schedule_offset_end': its config keeps that
    # key for snip_momentum only), so the methods are switched on as its scheduler would at step 0
    for module in model.modules():
        for flag in ("weight_quantization_enabled", "sparse_pruning_enabled", "row_pruning_enabled",
                     "head_pruning_enabled"):
            if hasattr(module, flag):
                setattr(module, flag, True)
    model.fc1.activation_quantization_enabled = True
    model.eval()
    out["compressed_state"] = {k: v.clone() for k, v in model.state_dict().items()}
    out["masks"] = {"sparse": model.v.get_mask("sparse"), "row": model.fc1.get_mask("row"),
                    "head": model.o.get_mask("head")}
    with torch.no_grad():
        out["masked"] = model(inputs["x"])
        redundancy_clean(model, CONFIG)
        out["cleaned"] = model(inputs["x"])
    out["shapes"] = {n: tuple(p.shape) for n, p in model.named_parameters()}
    net = conv_net()
    net.load_state_dict(inputs["conv_state"])
    init_compression(net, CONV_CONFIG)
    net.conv1.channel_pruning_enabled = True
    out["conv_compressed_state"] = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        out["conv_mask"] = net.conv1.get_mask("channel")
        out["conv_masked"] = net(inputs["image"])
        redundancy_clean(net, CONV_CONFIG)
        out["conv_cleaned"] = net(inputs["image"])
    return out


def dslaunch_side(inputs: dict, peer: dict) -> dict:
    from dslaunch.engine.features.compression import (
        compression_scheduler,
        init_compression,
        quantize,
        redundancy_clean,
        topk_mask,
    )
    w = inputs["w"]
    diffs = {}
    for kind, bits, groups in QUANT_CASES:
        ours = quantize(w, bits, groups, "asymmetric" if kind == "asymmetric" else "symmetric")
        diffs[f"quantize {kind} {bits}b {groups}g"] = \
            (ours - peer[f"q/{kind}/{bits}/{groups}"]).abs().max().item()
    diffs["topk_mask"] = (topk_mask(w.abs(), 0.3) - peer["topk"]).abs().max().item()
    model = Block()
    model.load_state_dict(inputs["state"])
    init_compression(model, CONFIG)
    # the topk head scores are random at init: take DeepSpeed's
    model.load_state_dict(peer["compressed_state"])
    compression_scheduler(model, CONFIG["compression_training"]).step(step_zero_check=True)
    model.eval()
    ours = {"sparse": model.v.get_mask("sparse"), "row": model.fc1.get_mask("row"),
            "head": model.o.get_mask("head")}
    for name, mask in ours.items():
        diffs[f"{name} mask"] = (mask - peer["masks"][name]).abs().max().item()
    with torch.no_grad():
        masked = model(inputs["x"])
        diffs["masked forward"] = (masked - peer["masked"]).abs().max().item()
        redundancy_clean(model, CONFIG)
        cleaned = model(inputs["x"])
    diffs["cleaned forward"] = (cleaned - peer["cleaned"]).abs().max().item()
    diffs["cleaned vs masked (ours)"] = (cleaned - masked).abs().max().item()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    diffs["same shapes after redundancy_clean"] = shapes == peer["shapes"]
    diffs["parameters before/after clean"] = [sum(p.numel() for p in Block().parameters()),
                                              sum(p.numel() for p in model.parameters())]
    net = conv_net()
    net.load_state_dict(inputs["conv_state"])
    init_compression(net, CONV_CONFIG)
    net.load_state_dict(peer["conv_compressed_state"])  # DeepSpeed's learned channel scores
    compression_scheduler(net, CONV_CONFIG).step(step_zero_check=True)
    with torch.no_grad():
        diffs["conv channel mask"] = (net.conv1.get_mask() - peer["conv_mask"]).abs().max().item()
        diffs["conv masked forward"] = (net(inputs["image"]) - peer["conv_masked"]).abs().max().item()
        redundancy_clean(net, CONV_CONFIG)
        diffs["conv cleaned forward"] = \
            (net(inputs["image"]) - peer["conv_cleaned"]).abs().max().item()
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default="/tmp/ds018/bin/python")
    parser.add_argument("--side", choices=["dslaunch", "deepspeed"], default="dslaunch")
    parser.add_argument("--io", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "deepspeed":
        inputs = torch.load(args.io + ".in", weights_only=True)
        torch.save(deepspeed_side(inputs), args.io + ".out")
        return
    torch.manual_seed(0)
    inputs = {"w": torch.randn(64, 48), "state": Block().state_dict(), "x": torch.randn(5, 32),
              "conv_state": conv_net().state_dict(), "image": torch.randn(2, 3, 9, 9)}
    with tempfile.TemporaryDirectory() as tmp:
        io = os.path.join(tmp, "io")
        torch.save(inputs, io + ".in")
        subprocess.run([args.peer, os.path.abspath(__file__), "--side", "deepspeed", "--io", io],
                       check=True, cwd=tmp, stdout=subprocess.DEVNULL)
        peer = torch.load(io + ".out", weights_only=True)
    print(json.dumps(dslaunch_side(inputs, peer)))


if __name__ == "__main__":
    sys.exit(main())
