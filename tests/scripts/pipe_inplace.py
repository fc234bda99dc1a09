"""A 2-stage pipeline whose second stage starts with ``ReLU(inplace=True)`` on the activation it
receives (DeepSpeedExamples' AlexNet pipeline splits its features this way), trained with
``train_batch``; with --reference the same layers as one ``nn.Sequential`` in one process.
Writes --out/{rank_R,ref}.json: the per-step losses (and, from the engine, each stage's layers).
"""

import argparse
import copy
import json
import os
from pathlib import Path

import torch
import torch.nn as nn

STEPS, BATCH, MICRO = 5, 8, 2


def layers():
    torch.manual_seed(0)
    return [nn.Linear(6, 12), nn.ReLU(inplace=True), nn.Linear(12, 12), nn.ReLU(inplace=True),
            nn.Linear(12, 3)]


def data(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 6, generator=g)
    return x, (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()


def reference():
    model = nn.Sequential(*copy.deepcopy(layers()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        loss = sum(nn.functional.cross_entropy(model(xm), ym)
                   for xm, ym in zip(x.chunk(BATCH // MICRO), y.chunk(BATCH // MICRO)))
        (loss / (BATCH // MICRO)).backward()
        opt.step()
        losses.append(loss.item() / (BATCH // MICRO))
    return {"losses": losses}


def pipeline():
    import dslaunch
    from dslaunch.pipe import PipelineModule

    dslaunch.init_distributed()
    # parameters split the two big Linears apart: stage 1 starts at the ReLU after the first
    module = PipelineModule(layers=layers(), num_stages=2, partition_method="type:Linear|ReLU",
                            loss_fn=nn.functional.cross_entropy)
    engine, *_ = dslaunch.initialize(model=module, model_parameters=module.parameters(), config={
        "train_batch_size": BATCH, "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "steps_per_print": 1000})
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        micro = iter(zip(x.chunk(BATCH // MICRO), y.chunk(BATCH // MICRO)))
        losses.append(engine.train_batch(data_iter=micro).item())
    return {"losses": losses, "layers": [type(m).__name__ for m in module.forward_funcs]}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    args = p.parse_args()
    result = reference() if args.reference else pipeline()
    name = "ref.json" if args.reference else f"rank_{os.environ.get('RANK', '0')}.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text(json.dumps(result))
