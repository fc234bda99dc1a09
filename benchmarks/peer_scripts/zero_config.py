"""The one training config given to DeepSpeed and to dslaunch in bench_train (no torch import).

DeepSpeed's JSON schema, which dslaunch accepts as it is: micro-batch per rank, no gradient
accumulation, Adam at a fixed lr, no gradient clipping, a ZeRO stage, optional CPU optimizer offload, bf16 on or off.
BENCH_ZERO_EXTRA (JSON, set by ``bench_train.py --zero-extra``) is merged into zero_optimization,
then ``extra`` (a rank script's ``--zero-extra``: bench_zeropp.py passes each configuration's keys
on the command line, which every launcher carries to remote hosts).
"""

import json
import os


def train_config(stage: int, precision: str = "fp32", offload: bool = False,
                 micro_batch: int = 4, lr: float = 1e-3, extra: str = "") -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1_000_000,
        # said, not left to the default: DeepSpeed 0.19.8 clips at 1.0 without the key, and the
        # DDP / torch.optim peers do not clip
        "gradient_clipping": 0.0,
    }
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg["zero_optimization"].update(json.loads(os.environ.get("BENCH_ZERO_EXTRA") or "{}"))
    cfg["zero_optimization"].update(parse_zero_extra(extra))  # a script's --zero-extra
    return cfg


def parse_zero_extra(text: str) -> dict:
    """``--zero-extra``: a JSON object, or ``key=value,key=value`` with JSON scalar values
    (``zero_hpz_partition_size=2,zero_quantized_weights=true``). The second form has no quotes,
    braces or spaces, so it survives launchers that paste arguments into a remote shell line
    (DeepSpeed's pdsh runner does)."""
    text = (text or "").strip()
    if not text:
        return {}
    if text.startswith("{"):
        out = json.loads(text)
        if not isinstance(out, dict):
            raise ValueError(f"--zero-extra: {text!r} is not a JSON object")
        return out
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--zero-extra: {item!r} is not key=value")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value  # a bare string
    return out


def format_zero_extra(extra: dict) -> str:
    """The ``key=value,...`` form of ``extra`` (scalars only), for parse_zero_extra."""
    return ",".join(f"{k}={json.dumps(v)}" for k, v in extra.items())
