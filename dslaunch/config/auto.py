"""Resolve "auto" values (Hugging Face's DeepSpeed configs write them) or reject them clearly.

Rules, in order (the batch triad's autos are left to ``batch.py``):
1. fp16.enabled / bf16.enabled: false (we have no Trainer flags to take them from; fp32 is the
   safe choice, and the source says "auto" so ``config show`` makes it visible).
2. ZeRO buckets (reduce_bucket_size, stage3_prefetch_bucket_size): Hugging Face derives them from
   the model's hidden size, which a config cannot know. We take DeepSpeed's default, capped at
   the model's parameter count when ``model_num_params`` is known (a bucket larger than the whole
   model only costs memory). stage3_param_persistence_threshold takes DeepSpeed's default.
3. optimizer.params.lr, scheduler total_num_steps and other required values with no default:
   rejected, naming the key and what to put there (guessing a learning rate or a training
   length would silently change the run).
4. scheduler warmup_max_lr: the optimizer's lr when that is a number, else rejected;
   warmup_num_steps: 0, the Hugging Face Trainer's default (no warmup), because DeepSpeed's default
   of 1000 can exceed a short run's total_num_steps.
5. Any other key with a documented default: that default (optimizer betas/eps/weight_decay take
   torch's Adam defaults). A key of a free-form section with no known meaning: rejected.
"""

from __future__ import annotations

from typing import Optional

from .batch import TRIAD
from .schema import SCHEDULER_PARAMS, TOP, Leaf, Section

OPTIMIZER_DEFAULTS = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0}
BUCKETS = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size")
WHAT_TO_PUT = {
    "optimizer.type": "an optimizer name, e.g. AdamW (or remove the optimizer section and pass "
                      "your own optimizer to dslaunch.initialize)",
    "scheduler.type": "a scheduler name: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest",
    "optimizer.params.lr": "the learning rate, e.g. 1e-3 (the Hugging Face Trainer fills it from "
                           "--learning_rate)",
    "scheduler.params.total_num_steps": "the number of optimizer steps of the run (the Hugging Face "
                                        "Trainer fills it from the dataset size and epochs)",
}


def resolve_autos(values: dict, sources: dict, autos: list, problems: list,
                  model_num_params: Optional[int]) -> None:
    for path in autos:
        if path in TRIAD:
            continue
        try:
            value = _auto_value(path, values, model_num_params)
        except _Reject as reject:
            problems.append(f'{path}: "auto" cannot be resolved here; put {reject.what}')
            continue
        _set(values, path, value)
        sources[path] = "auto"


class _Reject(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _auto_value(path: str, values: dict, model_num_params: Optional[int]):
    if path in WHAT_TO_PUT:
        raise _Reject(WHAT_TO_PUT[path])
    if path in ("fp16.enabled", "bf16.enabled"):
        return False
    spec = leaf_at(path, values)
    if path in BUCKETS:
        return min(spec.default, model_num_params) if model_num_params else spec.default
    if path == "scheduler.params.warmup_max_lr":
        lr = (values.get("optimizer") or {}).get("params", {}).get("lr")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            return float(lr)
        raise _Reject("the peak learning rate (a number; it is taken from optimizer.params.lr "
                      "when that is a number)")
    if path == "scheduler.params.warmup_num_steps":
        return 0
    name = path.rsplit(".", 1)[-1]
    if path.startswith("optimizer.params.") and name in OPTIMIZER_DEFAULTS:
        return OPTIMIZER_DEFAULTS[name]
    if spec is None:
        raise _Reject("a value (this key has no default to take)")
    if spec.default is None:
        raise _Reject(spec.describe() + " (this key has no default to take)")
    return spec.default


def leaf_at(path: str, values: dict) -> Optional[Leaf]:
    """The schema Leaf of a dotted path (scheduler params by the configured type), or None."""
    parts = path.split(".")
    if parts[:2] == ["scheduler", "params"] and len(parts) == 3:
        kind = (values.get("scheduler") or {}).get("type")
        section = SCHEDULER_PARAMS.get(kind)
        return section.fields.get(parts[2]) if section else None
    node = TOP
    for part in parts:
        if not isinstance(node, Section) or part not in node.fields:
            return None
        node = node.fields[part]
    return node if isinstance(node, Leaf) else None


def _set(values: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = values
    for part in parents:
        node = node[part]
    node[last] = value
