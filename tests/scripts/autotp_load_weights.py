"""Rank script: the tiny Llama of autotp_train.py at autotp_size --tp and ZeRO --stage loads only
the weights of a checkpoint (``load_optimizer_states=False``, so no fp32 master can overwrite a
wrong weight afterwards) and compares each of its parameters with its slice of the checkpoint's
consolidated fp32 state (``fp32_state_dict``). Writes the largest difference to
--out/rank_{r}.json."""

import argparse
import json
from pathlib import Path

import autotp_train as base
import torch.distributed as dist

import dslaunch
from dslaunch.engine.checkpoint.consolidate import fp32_state_dict
from dslaunch.engine.parallel.autotp import slice_tp_state

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--tag", required=True)
p.add_argument("--out", required=True)
p.add_argument("--tp", type=int, default=2)
p.add_argument("--stage", type=int, default=1)
args = p.parse_args()
dslaunch.init_distributed()
model = base.build("llama")
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": base.LR}},
          "zero_optimization": {"stage": args.stage}, "tensor_parallel": {"autotp_size": args.tp}}
engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
engine.load_checkpoint(args.ckpt, tag=args.tag, load_optimizer_states=False)
want = slice_tp_state(fp32_state_dict(args.ckpt, tag=args.tag)[0], engine.module)
diff = max((q.detach().float() - want[n]).abs().max().item()
           for n, q in engine.module.named_parameters())
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{dist.get_rank()}.json").write_text(json.dumps({"max_diff": diff}))
dist.destroy_process_group()
