"""Peer: PyTorch FSDP2 (``fully_shard`` on every block, then the root) + torch Adam(fused=True).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 fsdp2_train.py --out DIR [--precision bf16]

bf16 is ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: fp32 sharded master
weights and Adam, bf16 gathered parameters for compute, gradients reduced in fp32.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def main():
    args = common.parser(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = common.build_model(args)
    kw = {}
    if args.precision == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)

    def step(tokens, targets):
        loss = model(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = common.run_loop(args, step, common.build_batches(args, rank, world))
    common.write_result(args, "fsdp2", times, losses,
                        {"optimizer": "torch.optim.Adam(fused=True)", "wrap": "fully_shard per block + root"})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
