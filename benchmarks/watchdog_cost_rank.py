"""A rank of bench_watchdog_cost.py: the bench GPT (or its tiny version) under ZeRO-2, trained
in blocks of steps with the progress record alternately written and not, in the same process.

    dslaunch run --nproc-per-node 2 benchmarks/watchdog_cost_rank.py --out DIR [--smoke]
        [--steps N] [--warmup W] [--block K] [--plain]

Why in one run: steps/s between separate runs varies more on a shared machine than the record
could change it; alternating blocks of K steps (on, off, off, on, ...) inside one job puts both
modes under the same conditions. "Off" detaches the writer from every Comm and the engine and
uninstalls the bootstrap's recording of direct torch.distributed calls (what a job without
DSLAUNCH_PROGRESS_FILE runs), "on" puts both back. Rank 0 writes
``<out>/blocks.json``: the step seconds of each mode and the collectives numbered per step.

``--plain``: the same model trained by a plain torch loop instead (no engine: forward, backward,
one ``torch.distributed.all_reduce`` per gradient, Adam), whose collectives only the bootstrap's
recording sees (``dslaunch/torch_progress.py``); "off" uninstalls that recording (the original
torch functions, what a job without it runs), "on" installs it again. ``--aa`` leaves it off in
both kinds of block: the difference the block comparison shows by itself (its noise floor).
"""

import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_scripts"))

import common
import torch.distributed as dist
from zero_config import train_config

import dslaunch
from dslaunch import progress_record, torch_progress
from dslaunch.engine.comm.collectives import Comm


def plain(args, writer):
    """The --plain loop: {"on": [...], "off": [...]} step seconds."""
    import torch

    dist.init_process_group("gloo")
    model = common.build_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    params = [q for q in model.parameters() if q.requires_grad]
    rank, world = common.rank_world()
    batches = common.build_batches(args, rank, world)
    times = {"on": [], "off": []}
    for i, (tokens, targets) in enumerate(batches):
        on = (max(0, i - args.warmup) // args.block) % 4 in (0, 3)
        if on and not args.aa:
            torch_progress.install(writer)
        else:
            torch_progress.uninstall()
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        for q in params:
            dist.all_reduce(q.grad)
            q.grad.div_(world)
        opt.step()
        opt.zero_grad(set_to_none=False)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times["on" if on else "off"].append(dt)
    torch_progress.install(writer)
    return times, rank, len(batches)


def main():
    p = common.parser(__doc__)
    p.add_argument("--block", type=int, default=5, help="steps per block")
    p.add_argument("--plain", action="store_true", help="a plain torch loop, no engine")
    p.add_argument("--aa", action="store_true",
                   help="--plain with the recording off in both kinds of block (the noise floor)")
    args = p.parse_args()
    writer = progress_record.writer()
    if writer is None:
        sys.exit("watchdog_cost_rank.py: no DSLAUNCH_PROGRESS_FILE (run it under dslaunch run)")
    if args.plain:
        times, rank, n = plain(args, writer)
        _finish(args, writer, times, rank, n)
        return
    model = common.build_model(args)
    engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                          config=train_config(2, args.precision))
    holders = [o for o in gc.get_objects() if isinstance(o, Comm)] + [engine]
    rank, world = common.rank_world()
    batches = common.build_batches(args, rank, world)

    def step(tokens, targets):
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()

    times = {"on": [], "off": []}
    for i, (tokens, targets) in enumerate(batches):
        block = max(0, i - args.warmup) // args.block
        on = block % 4 in (0, 3)  # on, off, off, on: each mode first as often as second
        for h in holders:
            h._progress = writer if on else None
        if on:  # the bootstrap's recording of direct torch.distributed calls goes with it
            torch_progress.install(writer)
        else:
            torch_progress.uninstall()
        t0 = time.perf_counter()
        step(tokens, targets)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times["on" if on else "off"].append(dt)
    for h in holders:
        h._progress = writer
    torch_progress.install(writer)
    _finish(args, writer, times, rank, len(batches))


def _finish(args, writer, times, rank, steps):
    dist.barrier()
    if rank == 0:
        total = sum(writer._group_seq.values())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "blocks.json").write_text(json.dumps({
            "step_seconds": times, "collectives": total, "steps": steps}))


if __name__ == "__main__":
    main()
