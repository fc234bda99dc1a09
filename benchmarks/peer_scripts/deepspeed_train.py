"""Peer: DeepSpeed (from PyPI, run in its own venv) at a given ZeRO stage.

    OMP_NUM_THREADS=1 <peer-venv>/bin/torchrun --standalone --nproc-per-node 2 \
        deepspeed_train.py --out DIR --stage 2 [--offload] [--precision bf16]

The config is ``zero_config.train_config``, the one dslaunch gets too.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
from zero_config import train_config


def ds_config(args) -> dict:
    return train_config(args.stage, args.precision, args.offload, args.micro_batch, args.lr,
                        args.zero_extra)


def main():
    p = common.parser(__doc__)
    p.add_argument("--stage", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--offload", action="store_true", help="offload_optimizer: cpu")
    p.add_argument("--print-config", action="store_true", help="print the config and exit")
    args = p.parse_args()
    if args.print_config:
        print(json.dumps(ds_config(args)))
        return
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = common.build_model(args)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config(args))

    def step(tokens, targets):
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        return loss

    times, losses = common.run_loop(args, step, common.build_batches(args, rank, world),
                                   sync=common.device_sync(args))
    common.write_result(args, "deepspeed", times, losses,
                        {"stage": args.stage, "offload": args.offload, "deepspeed": deepspeed.__version__,
                         "optimizer": type(engine.optimizer).__name__,
                         "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
