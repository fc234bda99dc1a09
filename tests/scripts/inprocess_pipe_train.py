"""A pipeline job for in-process recovery: ``inprocess_pipe_train.py STEPS [CONFIG_JSON]``.

The tiny GPT of pipe_model.py as ``PipelineModule`` layers (embedding tied to the head, so the
stages reduce tied gradients too) over 2 stages x DP world/2, AdamW with clipping, trained with
``engine.train_batch()``. The data of step S is a function of S only: with ``PIPE_DATA=iter``
(the default) an iterator of step S's micro-batches is given to each ``train_batch`` call (each
data rank its rows); with ``PIPE_DATA=loader`` the engine's own loader serves them
(``training_data=``, ``train_batch()`` without an iterator; a replacement's is moved on to its
step by the engine). So a job that loses a rank and recovers sees the batches of a fault-free
one. Rank 0 prints ``step S loss L`` (the batch loss, full precision), every rank ``rank R pid
P start at step S`` once and ``rank R pid P done DIGEST`` at the end (its stage's weights and
optimizer state).

``PIPE_SHRINK_AT=S`` (under a plain ``dslaunch run``): after step S the last rank exits and the
others recover in process with the word a lost host would bring (one rank fewer), which a
pipeline job refuses (``engine/recovery/grid.world_change_refused``)."""

import json
import os
import sys

import shrink_world
import torch
from pipe_model import CFG, layer_list, loss_fn, pipe_specs
from state_digest import state_digest

import dslaunch
from dslaunch.pipe import PipelineModule

steps = int(sys.argv[1])
config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "gradient_clipping": 0.5, "steps_per_print": 10 ** 6, **config}
own_loader = os.environ.get("PIPE_DATA", "iter") == "loader"
shrink_at = int(os.environ.get("PIPE_SHRINK_AT", "-1"))
SEQ, ROWS = CFG.seq_len, 64  # the loader's dataset: 64 rows, served in order, epoch after epoch


def rows(seed: int, n: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CFG.vocab_size, (n, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


module = PipelineModule(pipe_specs(layer_list(tied=True)), num_stages=2, loss_fn=loss_fn,
                        seed_layers=True, base_seed=1234)
engine, *_ = dslaunch.initialize(model=module, config=config,
                                 training_data=torch.utils.data.TensorDataset(*rows(0, ROWS))
                                 if own_loader else None)
rank = engine.global_rank
print(f"rank {rank} pid {os.getpid()} start at step {engine.global_steps}", flush=True)
micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
grid = engine.grid


def micro_batches(step: int):
    """Step ``step``'s micro-batches of this data rank: the rows of its global batch."""
    x, y = rows(1 + step, micro * gas * grid.dp_world_size)
    mine = slice(grid.dp_rank * micro * gas, (grid.dp_rank + 1) * micro * gas)
    x, y = x[mine], y[mine]
    return iter([(x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro])
                 for i in range(gas)])


while engine.global_steps < steps:
    # an injected fault fires inside train_batch, at the step it names; a survivor's call that
    # meets it recovers, trains that batch again and returns its loss
    loss = engine.train_batch(None if own_loader else micro_batches(engine.global_steps))
    if rank == 0:
        print(f"step {engine.global_steps} loss {loss.item()!r}", flush=True)
    if engine.global_steps == shrink_at:
        shrink_world.shrink(engine)

print(f"rank {rank} pid {os.getpid()} done {state_digest(engine)}", flush=True)
