"""Rank script for the comms-logger test: an engine made with ``comms_logger.enabled`` trains one
step, then the script issues a known list of collectives through ``dslaunch.comm`` (all_reduce,
reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single, broadcast, sync and async),
then checks the switches (prof_ops filter, disabled). Writes what the logger and
``engine.comm_stats()`` saw to --out/rank_{r}.json."""

import argparse
import contextlib
import io
import json
import os

import torch

import dslaunch
import dslaunch.comm as dist

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
dslaunch.add_config_arguments(p)
args = p.parse_args()

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
engine, *_ = dslaunch.initialize(args=args, model=model)
rank, world = dist.get_rank(), dist.get_world_size()
enabled_by_config = dist.comms_logger.enabled

x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
engine.backward(engine(x).pow(2).mean())
engine.step()


def snapshot():
    """The logger's table and the booked stats of the world, taken together."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        summary = dist.log_summary(return_dict=True)
    logged = {op: {str(size): rec for size, rec in sizes.items()}
              for op, sizes in summary["summary"].items()}
    return logged, summary["booked"]["world"], printed.getvalue()


engine_logged, engine_booked, _ = snapshot()  # init broadcasts, gradient all-reduce
dist.reset_log()
# the script's own collectives: (op as booked, payload bytes, how many)
issued = []
t = torch.ones(16)
for _ in range(3):
    dist.all_reduce(t)
issued.append(("all_reduce", 64, 3))
dist.all_reduce(torch.ones(1000), async_op=True).wait()
issued.append(("all_reduce", 4000, 1))
out = torch.empty(8)
dist.reduce_scatter_tensor(out, torch.ones(8 * world))
dist.reduce_scatter_tensor(out, torch.ones(8 * world), async_op=True).wait()
issued.append(("reduce_scatter", 32 * world, 2))
gathered = torch.empty(8 * world)
dist.all_gather_into_tensor(gathered, torch.ones(8))
issued.append(("all_gather", 32, 1))
a2a = torch.empty(4 * world)
for _ in range(2):
    dist.all_to_all_single(a2a, torch.arange(4.0 * world))
issued.append(("all_to_all", 16 * world, 2))
dist.broadcast(torch.ones(5), src=0)
issued.append(("broadcast", 20, 1))

logged, booked, printed = snapshot()
with contextlib.redirect_stdout(io.StringIO()) as straggler_printed:  # DeepSpeed's breakdown
    stragglers = dist.log_summary(show_straggler=True, return_dict=True)["straggler_analysis"]
stragglers = {op: {str(size): rec for size, rec in sizes.items()} for op, sizes in stragglers.items()}

# prof_ops: only the named ops are recorded; enabled=False: nothing is
dist.reset_log()
dist.configure(prof_all=False, prof_ops=["broadcast"])
dist.all_reduce(torch.ones(3))
dist.broadcast(torch.ones(3), src=0)
only_broadcast = dist.get_logged_comm_ops()
dist.configure(enabled=False, prof_all=True, prof_ops=[])
dist.reset_log()
dist.all_reduce(torch.ones(3))
disabled_count = dist.get_comm_operation_count()

with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump({"world": world, "enabled_by_config": enabled_by_config, "issued": issued,
               "engine_logged": engine_logged, "engine_booked": engine_booked,
               "logged": logged, "booked": booked, "printed": printed,
               "only_broadcast": only_broadcast, "stragglers": stragglers,
               "straggler_printed": straggler_printed.getvalue(),
               "disabled_count": disabled_count}, f)
