"""An AutoTP job for in-process recovery: ``inprocess_autotp_train.py STEPS [CONFIG_JSON]``.

The tiny Llama of ``autotp_train.py`` split over ``tensor_parallel.autotp_size`` 2 (the world is
TP 2 x DP world/2), AdamW with clipping. The data of step S is a function of S only (its global
batch, each data rank taking its rows; both TP ranks of a data rank the same), so a job that
loses a rank and rolls back sees the batches of a fault-free one. Rank 0 prints ``step S loss L``
(its data rank's loss, full precision: the same on both TP ranks), every rank ``rank R pid P
start at step S`` once and ``rank R pid P done DIGEST`` at the end (its TP slices and their
optimizer state).

``AUTOTP_SHRINK_AT=S`` (under a plain ``dslaunch run``): after step S the last rank exits and the
others recover in process with the word a lost host would bring (one rank fewer), which an AutoTP
job refuses (``engine/recovery/grid.world_change_refused``)."""

import json
import os
import sys

import shrink_world
import torch
from autotp_train import SEQ, VOCAB, build
from state_digest import state_digest

import dslaunch

steps = int(sys.argv[1])
config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "gradient_clipping": 0.5, "tensor_parallel": {"autotp_size": 2},
          "steps_per_print": 10 ** 6, **config}
model = build("llama")
engine, *_ = dslaunch.initialize(model=model, config=config)
rank = engine.global_rank
print(f"rank {rank} pid {os.getpid()} start at step {engine.global_steps}", flush=True)
micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
dp_rank, dp_world = engine.mpu.get_data_parallel_rank(), engine.mpu.get_data_parallel_world_size()
shrink_at = int(os.environ.get("AUTOTP_SHRINK_AT", "-1"))


def batch(step: int, micro_step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + micro_step)
    ids = torch.randint(0, VOCAB, (micro * dp_world, SEQ), generator=g)
    return ids[dp_rank * micro:(dp_rank + 1) * micro]


while engine.global_steps < steps:
    step = engine.global_steps
    losses = []
    for m in range(gas):
        ids = batch(step, m)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()  # an injected fault fires in here, at the step it names
        losses.append(loss.detach())
    if engine.global_steps == step + 1 and rank == 0:  # (not rolled back by a recovery)
        print(f"step {engine.global_steps} loss {torch.stack(losses).mean().item()!r}", flush=True)
    if engine.global_steps == shrink_at:
        shrink_world.shrink(engine)


print(f"rank {engine.global_rank} pid {os.getpid()} done {state_digest(engine)}", flush=True)
