"""The one training config given to DeepSpeed and to dslaunch in bench_train (no torch import).

DeepSpeed's JSON schema, which dslaunch accepts as it is: micro-batch per rank, no gradient
accumulation, Adam at a fixed lr, a ZeRO stage, optional CPU optimizer offload, bf16 on or off.
BENCH_ZERO_EXTRA (JSON, set by ``bench_train.py --zero-extra``) is merged into zero_optimization.
"""

import json
import os


def train_config(stage: int, precision: str = "fp32", offload: bool = False,
                 micro_batch: int = 4, lr: float = 1e-3) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1_000_000,
    }
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg["zero_optimization"].update(json.loads(os.environ.get("BENCH_ZERO_EXTRA") or "{}"))
    return cfg
