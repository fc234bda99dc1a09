"""A DeepSpeed training script as its users write it (``import deepspeed``, DeepSpeed's
``--local_rank`` and ``--deepspeed_config`` arguments), not changed for dslaunch: run under
``dslaunch run --as-deepspeed`` or with DSLAUNCH_AS_DEEPSPEED=1 under torchrun. Each rank writes
``<out>/rank_<r>.json``: what its DeepSpeed names resolved to, the argv it got, its losses."""

import argparse
import json
import os
import sys

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--out", required=True)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)

g = torch.Generator().manual_seed(1)
data = [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(2 * 4)]
losses = []
for step in range(4):
    x, y = data[2 * step + dist.get_rank()]
    x, y = x.to(engine.device), y.to(engine.device)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / dist.get_world_size())

params = list(engine.module.parameters())
with deepspeed.zero.GatheredParameters(params):
    full_numel = sum(p.numel() for p in params)

os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{dist.get_rank()}.json"), "w") as f:
    json.dump({
        "engine_module": type(engine).__module__,
        "deepspeed_file": deepspeed.__file__,
        "deepspeed_version": deepspeed.__version__,
        "comm_module": dist.__name__,
        "accelerator_module": type(get_accelerator()).__module__,
        "adam_modules": [DeepSpeedCPUAdam.__module__, FusedAdam.__module__],
        "local_rank_arg": args.local_rank,
        "local_rank_env": int(os.environ["LOCAL_RANK"]),
        "argv": sys.argv[1:],
        "zero_stage": engine.zero_optimization_stage(),
        "full_numel": full_numel,
        "losses": losses,
    }, f)
