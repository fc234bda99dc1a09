"""Rank script for the fault-injection tests and bench_resilience.py: a tiny model trained by the
engine (or, with --plain, a torch loop that calls dslaunch.inject.tick), one line per step.

    STEP <rank> <global step> <time>      after each optimizer step
    DONE <rank> <steps>                   at the end

--save-dir/--save-every: checkpoint every N steps and resume from the last one at start
(engine.load_checkpoint, as a DeepSpeed script does), so a restarted job goes on where it was.
--step-sleep: seconds of "work" per step (keeps a long run cheap on a shared machine).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--plain", action="store_true", help="no engine: all_reduce + dslaunch.inject.tick")
p.add_argument("--save-dir")
p.add_argument("--save-every", type=int, default=0)
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


if args.plain:
    from dslaunch.inject import tick

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
        opt.step()
        step += 1
        time.sleep(args.step_sleep)
        print(f"STEP {rank} {step} {time.time():.3f}", flush=True)
        tick(step)
else:
    import dslaunch

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "steps_per_print": 10 ** 9}
    engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                     config=None if os.environ.get("DSLAUNCH_CONFIG") else config)
    rank = engine.global_rank
    if args.save_dir:
        engine.load_checkpoint(args.save_dir)
        if engine.global_steps:
            print(f"RESUMED {rank} {engine.global_steps} {time.time():.3f}", flush=True)
    while engine.global_steps < args.steps:
        x, y = batch(engine.global_steps, rank)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        time.sleep(args.step_sleep)
        engine.step()  # an injected fault fires in here, at the step it names
        print(f"STEP {rank} {engine.global_steps} {time.time():.3f}", flush=True)
        if args.save_dir and args.save_every and engine.global_steps % args.save_every == 0:
            engine.save_checkpoint(args.save_dir)
    step = engine.global_steps
print(f"DONE {rank} {step}", flush=True)
