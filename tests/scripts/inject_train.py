"""Rank script for the fault-injection tests and benchmarks/bench_resilience.py: a tiny model
trained by the engine (or, with --plain, a torch loop that calls dslaunch.inject.tick), one line
per event, each with the rank's clock and attempt (DSLAUNCH_/TORCHELASTIC_RESTART_COUNT):

    START <rank> <time> <attempt>          first thing, before torch is imported
    INIT <rank> <time> <attempt>           process group and engine ready
    RESUMED <rank> <step> <time> <attempt> a checkpoint was loaded (--save-dir)
    STEP <rank> <global step> <time> <attempt>   after each optimizer step
    DONE <rank> <steps>                    at the end

--save-dir/--save-every: checkpoint every N steps and resume from the last one at start
(engine.load_checkpoint, as a DeepSpeed script does). --step-sleep: seconds of "work" per step.
--until EPOCH: stop at the first step after that time (all ranks agree: one tiny all_reduce).
"""

import os
import time

RANK = os.environ.get("RANK", "0")
ATTEMPT = os.environ.get("DSLAUNCH_RESTART_COUNT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(f"START {RANK} {time.time():.3f} {ATTEMPT}", flush=True)

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--plain", action="store_true", help="no engine: all_reduce + dslaunch.inject.tick")
p.add_argument("--save-dir")
p.add_argument("--save-every", type=int, default=0)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--until", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def say(word, *fields):
    print(" ".join([word, RANK, *map(str, fields), f"{time.time():.3f}", ATTEMPT]), flush=True)


def time_is_up() -> bool:
    if not args.until:
        return False
    flag = torch.tensor([1.0 if time.time() >= args.until else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if args.plain:
    from dslaunch.inject import tick

    dist.init_process_group("gloo")
    say("INIT")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps and not time_is_up():
        x, y = batch(step, int(RANK))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
        opt.step()
        step += 1
        say("STEP", step)
        tick(step)
        time.sleep(args.step_sleep)  # after the step: a peer's fault at it is over before our next collective
else:
    import dslaunch

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "steps_per_print": 10 ** 9}
    engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                     config=None if os.environ.get("DSLAUNCH_CONFIG") else config)
    # a standby process promoted to a lost rank (--recover in-process) learns its rank here
    RANK = os.environ.get("RANK", RANK)
    ATTEMPT = os.environ.get("DSLAUNCH_RESTART_COUNT", ATTEMPT)
    say("INIT")
    if args.save_dir:
        engine.load_checkpoint(args.save_dir)
        if engine.global_steps:
            say("RESUMED", engine.global_steps)
    while engine.global_steps < args.steps:
        try:  # --recover in-process: the stop check a lost peer interrupted raises StepAbandoned
            if time_is_up():
                break
        except dslaunch.StepAbandoned:
            continue  # (the peer was replaced: check again, with it)
        x, y = batch(engine.global_steps, int(RANK))
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()  # an injected fault fires in here, at the step it names
        say("STEP", engine.global_steps)
        if args.save_dir and args.save_every and engine.global_steps % args.save_every == 0:
            engine.save_checkpoint(args.save_dir)
        time.sleep(args.step_sleep)  # after the step: a peer's fault at it is over before our next collective
    step = engine.global_steps
print(f"DONE {RANK} {step}", flush=True)
