"""Random-LTD on the example GPT (4 blocks, 32 tokens), DeepSpeed's way: ``initialize``, then
``convert_to_random_ltd(engine, Block)``; blocks 1 and 2 (the config's ``random_ltd_layer_id``)
see the schedule's kept tokens. Prints ``KEPT <step> <kept length>`` and ``LOSS <step> <global
mean loss>`` per step; ``--save DIR`` saves after the last step, ``--load DIR`` resumes from it.

    random_ltd_gpt.py --config CONFIG.json --steps N [--save DIR | --load DIR]
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dslaunch
from dslaunch.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
from gpt import GPT, Block, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save")
p.add_argument("--load")
dslaunch.add_config_arguments(p)
args = p.parse_args()

torch.manual_seed(0)
model = GPT(GPTConfig(seq_len=32, n_layer=4, d_model=32, n_head=2))
engine, *_ = dslaunch.initialize(args=args, model=model, model_parameters=model.parameters())
engine = convert_to_random_ltd(engine, Block)
torch.manual_seed(1000 + engine.global_rank)  # per-rank draws of the kept tokens
if args.load:  # also the RNG states: the draws continue where the saved run was
    engine.load_checkpoint(args.load)
rank, world = engine.global_rank, engine.world_size
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=32, global_batch=engine.train_batch_size())
for step in range(engine.global_steps, args.steps):
    tokens, targets = batches.batch_at(step, rank, world)
    total = torch.zeros(())
    for i in range(gas):
        loss = engine(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
        total += loss.detach().float()
        engine.backward(loss)
        engine.step()
    mean = total / gas
    dist.all_reduce(mean)
    if rank == 0:
        print(f"KEPT {step} {engine.random_ltd_scheduler.get_current_seq()}", flush=True)
        print(f"LOSS {step} {mean.item() / world:.8f}", flush=True)
if args.save:
    engine.save_checkpoint(args.save)
