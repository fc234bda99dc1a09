"""Rank script for tests/test_nonfinite_grad_skip.py: three optimizer steps of a tiny model, the
loss made NaN on step 1 (on one rank only: the reduction spreads it), at whatever ZeRO stage and
precision the config says, or (``--pipe``) as a 2-stage PipelineModule trained by train_batch.

Writes ``--out/rank_{r}.json``: per step the weights' digest before and after (this rank's own
parameters, gathered at ZeRO 3), whether they are all finite, ``skipped_steps``,
``global_steps``, the lr and ``get_global_grad_norm()`` after the step.
"""

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch

import dslaunch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_mlp import IN, OUT, batch, model

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--pipe", action="store_true")
p.add_argument("--nan-step", type=int, default=1)
p.add_argument("--steps", type=int, default=3)
args, _ = p.parse_known_args()
dslaunch.init_distributed()
rank = torch.distributed.get_rank()
state = {"step": -1}


def poisoned(loss):
    """NaN on the chosen step, on the first rank that computes a loss (rank 0; the last pipe
    stage with --pipe)."""
    first = (torch.distributed.get_world_size() - 1) if args.pipe else 0
    if state["step"] == args.nan_step and rank == first:
        return loss * float("nan")
    return loss


if args.pipe:
    from dslaunch.pipe import LayerSpec, PipelineModule

    def loss_fn(out, y):
        return poisoned(torch.nn.functional.mse_loss(out.float(), y.float()))

    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, IN, 16), LayerSpec(torch.nn.GELU),
                             LayerSpec(torch.nn.Linear, 16, 16), LayerSpec(torch.nn.Linear, 16, OUT)],
                            num_stages=2, loss_fn=loss_fn, partition_method="uniform")
    engine, _, _, _ = dslaunch.initialize(args=args, model=module)
else:
    engine, _, _, _ = dslaunch.initialize(args=args, model=model(0))


def digest():
    params = list(engine.module.parameters())
    with dslaunch.zero.GatheredParameters(params):
        flat = torch.cat([q.detach().float().reshape(-1) for q in params])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest(), bool(torch.isfinite(flat).all())


records = []
for step in range(args.steps):
    state["step"] = step
    before, _ = digest()
    if args.pipe:
        gas = engine.gradient_accumulation_steps()
        mbs = [batch(step, m, 0) for m in range(gas)]
        if engine.is_first_stage() or engine.is_last_stage():
            engine.train_batch(iter(mbs))
        else:
            engine.train_batch()
    else:
        for m in range(engine.gradient_accumulation_steps()):
            x, y = batch(step, m, rank)
            loss = poisoned(engine(x.to(engine.device), y.to(engine.device)))
            engine.backward(loss)
            engine.step()
    print(f"nonfinite_grad: step {step} done", flush=True)
    after, finite = digest()
    norm = engine.get_global_grad_norm()
    records.append({"step": step, "before": before, "after": after, "finite": finite,
                    "skipped_steps": engine.skipped_steps, "global_steps": engine.global_steps,
                    "lr": engine.get_lr()[0],
                    "grad_norm": None if norm is None else float(norm)})
    if norm is not None and not math.isfinite(float(norm)):
        records[-1]["grad_norm"] = str(float(norm))

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"rank_{rank}.json").write_text(json.dumps(records))
torch.distributed.destroy_process_group()
