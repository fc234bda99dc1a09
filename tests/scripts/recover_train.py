"""A dslaunch engine job for in-process recovery: ``recover_train.py STEPS [CONFIG_JSON]``.

The data of step S is a function of S and of the world size at that step (the step's global
batch, split over the ranks in order), so a job that loses a rank mid-step and rolls back sees the
same batches as a fault-free one. Rank 0 prints ``step S loss L`` (its own share's loss, 8
decimals: no collective of the script's own between steps, which a recovery could not resume)
and every rank prints ``rank R pid P start`` once and ``rank R pid P done`` at the end.

- ``RECOVER_SLEEP=SECONDS``: sleep after each step (a fault then lands mid-job);
- ``RECOVER_LOG_ALLREDUCE=1``: after each step every rank all-reduces its loss with
  ``torch.distributed`` itself, as most training loops log (a collective of the script's own), and
  prints ``rank R step S mean loss M`` (8 decimals);
- ``RECOVER_STOP_CHECK=1``: at the top of each iteration, before its first forward, every rank
  all-reduces a stop flag (as loops with a time budget or an early stop do);

the loop is the pattern docs/resilience.md shows: a ``dslaunch.StepAbandoned`` (a collective of the
script's own that an in-process recovery interrupted, or made in the step it abandoned) is caught,
printed as ``rank R step S abandoned``, and the loop goes on to its next iteration;
- ``RECOVER_REFERENCE=4@0,2@7``: no launcher, one process trains on the whole global batch of
  each step, with the world size that step had (4 from step 0, 2 from step 7): the reference a
  job whose world shrank at step 7 must match (the mean loss over the ranks' equal shares is the
  mean over the global batch), printing the loss of rank 0's share;
- ``RECOVER_SHRINK_AT=S`` (ZeRO 1-3, under a plain ``dslaunch run``): the ranks' side of a world
  that shrinks, driven here without a lost host (the launcher's side needs namespace hosts:
  tests/multihost/test_inprocess_hosts.py): every rank keeps shard copies; after step S the last
  rank exits and the others recover in process (``engine/recovery/rejoin.recover``, with the word
  the launcher would send: one rank fewer, a new store port) and go on as a world one smaller.
"""

import json
import os
import sys
import time

import shrink_world
import torch
from state_digest import state_digest

import dslaunch

steps = int(sys.argv[1])
config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5,
                                                       "warmup_max_lr": 1e-2}},
          "steps_per_print": 10 ** 6, **config}
reference = [tuple(map(int, part.split("@"))) for part in
             os.environ.get("RECOVER_REFERENCE", "").split(",") if part]
sleep = float(os.environ.get("RECOVER_SLEEP", "0"))
shrink_at = int(os.environ.get("RECOVER_SHRINK_AT", "-1"))
log_allreduce = os.environ.get("RECOVER_LOG_ALLREDUCE") == "1"
stop_check = os.environ.get("RECOVER_STOP_CHECK") == "1"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
engine, *_ = dslaunch.initialize(model=model, config=config)
print(f"rank {engine.global_rank} pid {os.getpid()} start at step {engine.global_steps}",
      flush=True)
micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
if shrink_at >= 0:
    from dslaunch.engine.recovery.inprocess import keep_shard_copies

    keep_shard_copies(engine)


def shrink() -> None:
    """The last rank leaves; the others rebuild the group one smaller and re-partition."""
    shrink_world.shrink(engine)
    print(f"rank {engine.global_rank} goes on in a world of {engine.world_size}", flush=True)


def world_at(step: int) -> int:
    if not reference:
        return engine.world_size
    return [w for w, start in reference if start <= step][-1]


def batch(step: int, micro_step: int):
    """(x, y) of this rank's share, and the slice of rank 0's share in it."""
    world = world_at(step)
    g = torch.Generator().manual_seed(1000 * step + micro_step)
    x = torch.randn(micro * world, 16, generator=g)
    y = x[:, :1].sin() + 0.1 * x[:, 1:2]
    if reference:  # one process, the whole global batch
        return x, y, slice(0, micro)
    share = slice(engine.global_rank * micro, (engine.global_rank + 1) * micro)
    return x[share], y[share], slice(0, micro)


def stop_requested() -> bool:
    flag = torch.zeros(1)  # never set here: the collective is what the check is for
    if stop_check:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def iteration() -> bool:
    """One step of the loop; False: stop."""
    if stop_requested():
        return False
    step = engine.global_steps
    losses, shares = [], []
    for m in range(gas):
        x, y, first = batch(step, m)
        out = engine(x)
        loss = torch.nn.functional.mse_loss(out, y)
        engine.backward(loss)
        engine.step()
        losses.append(torch.nn.functional.mse_loss(out[first], y[first]).detach())
        shares.append(loss.detach())
    stepped = engine.global_steps == step + 1  # (not rolled back by a recovery)
    if stepped and engine.global_rank == 0:
        print(f"step {engine.global_steps} loss {torch.stack(losses).mean().item():.8f}", flush=True)
    if log_allreduce:  # the script's own collective, outside the engine
        mean = torch.stack(shares).mean()
        torch.distributed.all_reduce(mean)
        if stepped:
            print(f"rank {engine.global_rank} step {engine.global_steps} mean loss "
                  f"{mean.item() / engine.world_size:.8f}", flush=True)
    if stepped:
        time.sleep(sleep)
        if engine.global_steps == shrink_at:
            shrink()
    return True


while engine.global_steps < steps:
    try:
        if not iteration():
            break
    except dslaunch.StepAbandoned:  # a peer was lost and replaced in process: the step again
        print(f"rank {engine.global_rank} step {engine.global_steps + 1} abandoned", flush=True)


print(f"rank {engine.global_rank} pid {os.getpid()} done {state_digest(engine)}", flush=True)
