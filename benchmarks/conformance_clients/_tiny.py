"""What the tutorial snippets share: a tiny classifier, a seeded synthetic dataset with learnable
classes, and the command line DeepSpeed's tutorials give a script (``--local_rank`` and
``deepspeed.add_config_arguments``). Nothing here imports DeepSpeed until asked: the snippet's
own ``import deepspeed`` decides whose engine runs."""

import argparse

import torch
import torch.nn as nn

IN, HIDDEN, CLASSES = 16, 32, 4


def args(extra=None):
    import deepspeed

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=6)
    if extra:
        extra(parser)
    return deepspeed.add_config_arguments(parser).parse_args()


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def dataset(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, IN, generator=g) * 2
    labels = torch.arange(n) % CLASSES
    return torch.utils.data.TensorDataset(centers[labels] + torch.randn(n, IN, generator=g),
                                          labels)


def report(step, loss):
    """The line the sweep parses (rank 0 only)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"step {step} loss {float(loss):.6f}", flush=True)
