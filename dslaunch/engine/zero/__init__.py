"""ZeRO strategies behind one seam: ``build_optimizer_strategy`` picks the stage's class.

Stage 0 (plain data parallel) is ``stage0.py``; stages 1-3 plug in as ``stage1.py`` ...
``stage3.py``, each exposing ``Stage{N}Strategy`` with the interface of ``base.OptimizerStrategy``.
"""

from __future__ import annotations

import importlib

from .base import OptimizerStrategy


def build_optimizer_strategy(stage: int, model, optimizer, cfg: dict, comm,
                             precision) -> OptimizerStrategy:
    """The strategy object for ZeRO ``stage`` (0-3).

    ``cfg``: the resolved config values (a dict, DeepSpeed's keys); ``comm``: the data-parallel
    ``engine.comm.Comm``; ``precision``: ``engine.precision.Precision``. Called with the model's
    parameters still in fp32 and a fresh optimizer built on them; the strategy casts the model
    to the training dtype itself when it needs to (after taking its fp32 masters).
    """
    stage = int(stage or 0)
    if hasattr(optimizer, "wants_grad_allreduce"):  # 1-bit optimizers: zero/onebit_strategy.py
        from .onebit_strategy import build_onebit_strategy
        return build_onebit_strategy(stage, model, optimizer, cfg, comm, precision)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage: {stage} is not a ZeRO stage (0-3)")
    try:
        module = importlib.import_module(f"{__name__}.stage{stage}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.stage{stage}":
            raise
        raise NotImplementedError(f"zero_optimization.stage: ZeRO stage {stage} is not available "
                                  "in this build") from None
    cls = getattr(module, f"Stage{stage}Strategy")
    from .nvme_swap import uses_nvme
    if uses_nvme(cfg):  # optimizer states on NVMe: the strategy's offload path, states swapped
        if stage == 0:
            raise ValueError("zero_optimization.offload_optimizer.device: nvme needs "
                             "zero_optimization.stage 1, 2 or 3 (stage 0 offloads nothing)")
        from .nvme_swap import with_nvme_swap
        cls = with_nvme_swap(cls)
    return cls(model, optimizer, cfg, comm, precision)


__all__ = ["OptimizerStrategy", "build_optimizer_strategy"]
