"""Rank script for tests/test_utils_face.py: dslaunch.utils on a real job (the tiny example GPT,
TextBatches, the ZeRO stage and precision the config says).

- log_dist on ranks [0], [-1], none, and after ``logger.setLevel(WARNING)``;
- dslaunch.utils.groups: size, rank and member ranks per axis;
- at step 0's boundary, between backward and step: ``safe_get_full_grad`` of every parameter
  (stage 0 also records ``p.grad``, the oracle);
- after the last step: ``safe_get_full_fp32_param``, ``safe_get_full_optimizer_state`` and the
  ``safe_get_local_*`` pieces of every parameter; a checkpoint ``final`` of those weights;
- then ``safe_set_full_fp32_param`` / ``safe_set_full_optimizer_state`` on one parameter, read
  back, the training-dtype weight checked, a checkpoint ``after_set``, one more step;
- ``--leaf``: ``set_z3_leaf_modules(model, [Block])`` before initialize; every run records
  whether a Block's parameters are all whole while its last Linear runs (forward).
Writes --out/rank_{r}.json and --out/rank_{r}_values.pt.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dslaunch
from dslaunch.utils import (
    groups,
    log_dist,
    logger,
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
    set_z3_leaf_modules,
)
from dslaunch.zero import GatheredParameters
from gpt import GPT, Block, GPTConfig, TextBatches, stdlib_bytes

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--save-dir", required=True)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--leaf", action="store_true")
args = p.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

torch.manual_seed(0)
model = GPT(GPTConfig(seq_len=16, n_layer=2, d_model=32, n_head=2))
marked = len(set_z3_leaf_modules(model, [Block])) if args.leaf else 0
engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters())
rank, world = engine.global_rank, engine.world_size
rec = {"rank": rank, "world": world, "stage": engine.zero_stage, "dtype": engine.precision.name,
       "leaf_marked": marked}

# -- log_dist -------------------------------------------------------------------------------------
log_dist("to rank zero", ranks=[0])
log_dist("to every rank", ranks=[-1])
log_dist("to no rank")
logger.setLevel(logging.WARNING)
log_dist("quiet info", ranks=[-1])
log_dist("loud warning", ranks=[-1], level=logging.WARNING)
logger.setLevel(logging.INFO)

# -- groups ---------------------------------------------------------------------------------------
rec["groups"] = {}
for axis in ("data_parallel", "model_parallel", "tensor_model_parallel", "pipe_parallel",
             "sequence_parallel", "sequence_data_parallel"):
    group = getattr(groups, f"_get_{axis}_group")()
    rec["groups"][axis] = {"world_size": getattr(groups, f"_get_{axis}_world_size")(),
                           "rank": getattr(groups, f"_get_{axis}_rank")(),
                           "ranks": dist.get_process_group_ranks(group)}

# -- leaf modules: is a Block whole while its MLP's output Linear runs? ---------------------------
block = model.blocks[0]
whole_in_block = []
block.mlp.proj.register_forward_pre_hook(lambda *_: whole_in_block.append(
    all(q.untyped_storage().nbytes() > 0 for q in block.parameters())))
strategy = engine.strategy
if hasattr(strategy, "plan"):  # stage 3: the modules that have a fetch unit of their own
    rec["units"] = sorted({type(m).__name__ for m in strategy.plan.fetch})

named = list(model.named_parameters())
values = {"grads": {}, "oracle_grads": {}}
batches = TextBatches(stdlib_bytes(1 << 20), seq_len=16, global_batch=engine.train_batch_size(),
                      seed=0)
mb, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()


rec["losses"] = []


def train_step(step):
    tokens, targets = batches.batch_at(step, rank, world)
    total = torch.zeros(())
    for i in range(gas):
        loss = engine(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb])
        total += loss.detach().float()
        engine.backward(loss)
        if step == 0 and engine.is_gradient_accumulation_boundary():
            for name, q in named:  # collective: every rank, same order
                values["grads"][name] = safe_get_full_grad(q)
                if engine.zero_stage == 0 and q.grad is not None:
                    values["oracle_grads"][name] = q.grad.detach().float().clone()
            values["local_grads"] = {n: safe_get_local_grad(q) for n, q in named}
        engine.step()
    dist.all_reduce(total)  # the global mean loss, for comparisons between runs
    rec["losses"].append(total.item() / (gas * world))


for step in range(args.steps):
    train_step(step)
rec["whole_block_in_forward"] = whole_in_block

# -- whole values after the last step, and the checkpoint of those weights ------------------------
values["fp32"] = {n: safe_get_full_fp32_param(q) for n, q in named}
values["states"] = {key: {n: safe_get_full_optimizer_state(q, key) for n, q in named}
                    for key in ("exp_avg", "exp_avg_sq")}
values["local_fp32"] = {n: safe_get_local_fp32_param(q) for n, q in named}
values["local_exp_avg"] = {n: safe_get_local_optimizer_state(q, "exp_avg") for n, q in named}
engine.save_checkpoint(args.save_dir, tag="final")

# -- setters --------------------------------------------------------------------------------------
target_name = "blocks.0.mlp.fc.weight"
target = dict(named)[target_name]
new_value = torch.linspace(-1, 1, target.numel()).reshape(target.shape) / 3  # not bf16-exact
# half the moments it has: the next step stays an ordinary Adam step of about lr
new_state = safe_get_full_optimizer_state(target, "exp_avg") * 0.5
safe_set_full_fp32_param(target, new_value)
safe_set_full_optimizer_state(target, new_state, "exp_avg")
with GatheredParameters([target]):
    weight = target.detach().clone()
rec["set"] = {
    "fp32_back": bool(torch.equal(safe_get_full_fp32_param(target), new_value)),
    "state_back": bool(torch.equal(safe_get_full_optimizer_state(target, "exp_avg"), new_state)),
    "weight_is_value_in_dtype": bool(torch.equal(weight, new_value.to(weight.dtype))),
}
values["set"] = {"name": target_name, "value": new_value, "state": new_state}
engine.save_checkpoint(args.save_dir, tag="after_set")
train_step(args.steps)
moved = (safe_get_full_fp32_param(target) - new_value).abs()
rec["set"]["moved_max"], rec["set"]["moved_min"] = moved.max().item(), moved.min().item()

(out / f"rank_{rank}.json").write_text(json.dumps(rec))
torch.save(values, out / f"rank_{rank}_values.pt")
