"""Peer: DeepSpeed's MoE (``deepspeed.moe.layer.MoE``) training examples/moe_gpt.py's model, the
one examples/train_moe_gpt.py trains with ``dslaunch.moe``, on the same data with the same config.

    OMP_NUM_THREADS=1 <peer-venv>/bin/torchrun --standalone --nproc-per-node 4 \
        deepspeed_moe_train.py --config c.json --experts 4 --ep 2 --top-k 1 --steps 30 --json o.json

The optimizer groups are DeepSpeed's ``split_params_into_different_moe_groups_for_optimizer``
(required by its ZeRO with MoE). Rank 0 writes the per-step losses (averaged over the ranks),
tokens/s after ``--warmup`` steps, the all-to-all bytes per step (input bytes handed to
``deepspeed.comm.all_to_all_single``, counted by a wrapper: no comms-logger synchronisation) and
every rank's peak RSS.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch
from moe_gpt import MoEGPT

from gpt import GPTConfig, TextBatches, stdlib_bytes


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--capacity-factor", type=float, default=1.0)
    p.add_argument("--min-capacity", type=int, default=4)
    p.add_argument("--dropless", action="store_true")
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20)
    p.add_argument("--json", required=True)
    return p.parse_args()


def main():
    args = parse_args()
    import deepspeed
    import deepspeed.comm as dscomm
    import torch.distributed as dist
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    a2a = {"calls": 0, "bytes": 0}
    inner = dscomm.all_to_all_single

    def counted(output, tensor, *a, **kw):
        a2a["calls"] += 1
        a2a["bytes"] += tensor.numel() * tensor.element_size()
        return inner(output, tensor, *a, **kw)

    dscomm.all_to_all_single = counted  # sharded_moe calls it through the module
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    cfg = GPTConfig(seq_len=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                    d_model=args.d_model)
    model = MoEGPT(cfg, MoE, experts=args.experts, ep=args.ep, top_k=args.top_k,
                   capacity_factor=args.capacity_factor, min_capacity=args.min_capacity,
                   dropless=args.dropless, aux_coef=args.aux_coef)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "parameters"})
    with open(args.config) as f:
        config = json.load(f)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    batch = engine.train_batch_size()
    data = TextBatches(stdlib_bytes(args.data_bytes), seq_len=args.seq_len, global_batch=batch,
                       seed=args.seed)
    steps, t0, a2a_at_warmup = [], None, 0
    for step in range(args.steps):
        if step == args.warmup:
            t0, a2a_at_warmup = time.perf_counter(), a2a["bytes"]
        tokens, targets = data.batch_at(step, rank, world)
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        figures = torch.tensor([float(loss.detach()), model.last_aux, model.dropped_fraction()],
                               dtype=torch.float64)
        dist.all_reduce(figures)
        loss_v, aux_v, drop_v = (figures / world).tolist()
        steps.append({"step": step + 1, "loss": loss_v, "aux_loss": aux_v, "dropped": drop_v})
    elapsed = time.perf_counter() - t0
    timed = args.steps - args.warmup
    rss = [None] * world
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"runtime": "deepspeed", "deepspeed": deepspeed.__version__, "world": world,
                       "steps": steps, "tokens_per_s": timed * batch * args.seq_len / elapsed,
                       "all_to_all_bytes_per_step": (a2a["bytes"] - a2a_at_warmup) / timed,
                       "all_to_all_calls": a2a["calls"], "peak_rss_bytes": rss,
                       "threads": os.environ.get("OMP_NUM_THREADS")}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
