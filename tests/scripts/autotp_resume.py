"""Rank script: the tiny Llama of autotp_train.py resumed from a checkpoint written at another
tensor-parallel size (--ckpt, --tag, saved after --start steps at ZeRO --stage), trained --more
steps at autotp_size --tp and the same stage, against the unsplit single-process reference
trained --start + --more steps in this process. Writes the resumed losses, the reference's and the step counter to
--out/rank_{r}.json."""

import argparse
import json
from pathlib import Path

import autotp_train as base
import torch
import torch.distributed as dist

import dslaunch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--tp", type=int, default=1)
p.add_argument("--start", type=int, default=10)
p.add_argument("--more", type=int, default=4)
p.add_argument("--stage", type=int, default=0)
p.add_argument("--tag", default="tp")
p.add_argument("--model", default="llama", help="a kind of autotp_train.build")
args, _ = p.parse_known_args()
dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
dp, dp_rank = world // args.tp, rank // args.tp
micro = base.BATCH // (dp * base.MICRO_STEPS)
ref = base.reference(args.model, args.start + args.more)[0][args.start:]
model = base.build(args.model)
config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": base.MICRO_STEPS,
          "optimizer": {"type": "AdamW", "params": {"lr": base.LR, "weight_decay": 0.01}},
          "gradient_clipping": base.CLIP, "zero_optimization": {"stage": args.stage},
          "tensor_parallel": {"autotp_size": args.tp}, "steps_per_print": 1000}
engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
engine.load_checkpoint(args.ckpt, tag=args.tag)
resumed_at = engine.global_steps
losses = []
for step in range(args.start, args.start + args.more):
    ids = base.batch(step)
    total = 0.0
    for m in range(base.MICRO_STEPS):
        lo = (dp_rank * base.MICRO_STEPS + m) * micro
        loss = engine(input_ids=ids[lo:lo + micro], labels=ids[lo:lo + micro]).loss
        engine.backward(loss)
        engine.step()
        total += loss.item() / base.MICRO_STEPS
    t = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(t)
    losses.append(t.item() / world)
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(
    {"losses": losses, "ref": ref, "resumed_at": resumed_at}))
dist.destroy_process_group()
