"""Several ZeRO-3 configs trained one after the other in one job (plain, hpZ, MiCS, ...): the
tiny GPT of examples/gpt.py on TextBatches, the same data and seed for each. Writes on rank 0, the
host layout every rank sees ("layouts": [host, local index, intra-, inter-host group size]) and,
per run: the per-step global losses, the comm stats of the training steps, the memory breakdown
and, where the run saves a checkpoint, the fp32 weights the engine held (gathered) and whether a
plain ZeRO-3 engine loading it (resharded) got the same weights back.

    dslaunch run --nproc-per-node 4 tests/scripts/zero_hier_train.py --runs "$(cat runs.json)" \
        --out o.json

``--runs``: JSON text, {name: {"config": {...}, "save": DIR (optional), "expect_error": true
(optional: only record the ValueError building the engine raises)}}.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from train_steps import micro_steps  # noqa: E402

import dslaunch  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--runs", required=True)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--out", required=True)
a = ap.parse_args()

dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
# the host layout the engine sees (engine/comm/host_groups.py): every rank's (host, local index, size
# of its intra-host group, size of its inter-host group)
from dslaunch.engine.comm.host_groups import host_layout  # noqa: E402

lay = host_layout()
mine = (lay.host, lay.local_rank, dist.get_world_size(lay.intra) if lay.intra else 1,
        dist.get_world_size(lay.inter) if lay.inter else 1)
layouts = [None] * world
dist.all_gather_object(layouts, mine)
gpt = GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=32)
batches = TextBatches(stdlib_bytes(1 << 18), seq_len=gpt.seq_len, global_batch=8)


def build(config):
    torch.manual_seed(0)
    model = GPT(gpt)
    engine, _, _, _ = dslaunch.initialize(model=model, config=config)
    return engine


def weights(engine) -> dict:
    """The whole fp32 weights (a collective; rank 0 keeps them)."""
    sd = engine.strategy.module_state_dict(keep=rank == 0)
    return {k: v.float().cpu() for k, v in sd.items()}


out = {}
for name, run in json.loads(a.runs).items():
    if run.get("expect_error"):  # a config the engine must refuse, on every rank alike
        try:
            build(run["config"])
            out[name] = {"error": None}
        except ValueError as e:
            out[name] = {"error": str(e)}
        continue
    engine = build(run["config"])
    engine.comm.reset_stats()
    gas = engine.gradient_accumulation_steps()
    losses = []
    for step in range(a.steps):
        tot = micro_steps(engine, batches, step, gas, rank, world)
        dist.all_reduce(tot)
        losses.append(tot.item() / world)
    rec = {"losses": losses, "comm": engine.comm_stats(), "memory": engine.memory_breakdown(),
           "world": engine.strategy.world, "dp_world": world}
    if run.get("save"):
        engine.save_checkpoint(run["save"], tag="t")
        held = weights(engine)
        if rank == 0:
            torch.save(held, Path(run["save"]) / "held.pt")
        # a plain ZeRO-3 job of the same size loads it (the shards resharded on load)
        plain = dict(run["config"], zero_optimization={
            "stage": 3, "reduce_bucket_size": run["config"]["zero_optimization"].get(
                "reduce_bucket_size", 20000)})
        other = build(plain)
        other.load_checkpoint(run["save"], tag="t")
        back = weights(other)
        if rank == 0:
            rec["reload_max_diff"] = max((back[k] - held[k]).abs().max().item() for k in held)
    out[name] = rec
    dist.barrier()
if rank == 0:
    out["layouts"] = layouts
    Path(a.out).write_text(json.dumps(out))
dist.barrier()
dist.destroy_process_group()
