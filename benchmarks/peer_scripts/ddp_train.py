"""Peer: plain PyTorch DDP + torch Adam(fused=True), launched by torchrun.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 ddp_train.py --out DIR [--precision bf16]

bf16 is autocast (fp32 weights, fp32 Adam, bf16 matmuls), the usual torch recipe.
"""

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    args = common.parser(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(common.build_model(args))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext

    def step(tokens, targets):
        with autocast():
            loss = model(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = common.run_loop(args, step, common.build_batches(args, rank, world))
    common.write_result(args, "ddp", times, losses, {"optimizer": "torch.optim.Adam(fused=True)"})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
