"""ZeRO strategies behind one seam: ``build_optimizer_strategy`` picks the stage's class from
``STRATEGIES`` and hands it the config sections it reads.

Stage 0 (plain data parallel) is ``stage0.py``, stages 1 and 2 ``stage12.py``, stage 3
``stage3.py``; every one has the interface of ``base.OptimizerStrategy``. Two variations wrap
that choice: the 1-bit optimizers run on ``engine/zero/onebit_strategy.OneBitStrategy`` (stage 0
only), and optimizer states on NVMe (``offload_optimizer.device: nvme``) add
``nvme.strategy.with_nvme_swap`` to the stage's class. An engine built without an optimizer gets
a forward-only strategy (``no_optimizer.py``).

Beside the strategies: ``zero_init.py`` (``dslaunch.zero``: Init, GatheredParameters, the
registry of strategies by parameter), ``param_access.py`` (one parameter's whole fp32 value,
gradient or optimizer state, whatever the stage: ``dslaunch.utils.safe_get_full_*``) and
``leaf_modules.py`` (ZeRO-3 leaf modules, which ``stage3_units.py`` makes one unit) and
``quantized_comm.py`` (ZeRO++'s quantized all-gather and hierarchical reduce-scatter, which
stage 3 uses with ``zero_quantized_weights`` / ``zero_quantized_gradients``).
"""

from __future__ import annotations

from dslaunch.config import onebit_problems
from dslaunch.engine.zero.base import OptimizerStrategy
from dslaunch.engine.zero.no_optimizer import build_no_optimizer_strategy
from dslaunch.engine.zero.nvme.strategy import with_nvme_swap
from dslaunch.engine.zero.stage0 import Stage0Strategy
from dslaunch.engine.zero.stage3 import Stage3Strategy
from dslaunch.engine.zero.stage12 import Stage1Strategy, Stage2Strategy

STRATEGIES = {0: Stage0Strategy, 1: Stage1Strategy, 2: Stage2Strategy, 3: Stage3Strategy}


def build_optimizer_strategy(model, optimizer, cfg, comm, precision) -> OptimizerStrategy:
    """The strategy object for the config's ZeRO stage.

    ``cfg``: the typed config (``dslaunch.config.sections``), validated: the stage is 0-3 and
    every impossible combination was refused by ``dslaunch.config``; ``comm``: the data-parallel
    ``engine.comm.Comm``; ``precision``: ``engine.precision.Precision``. Called with the model's
    parameters still in fp32 and a fresh optimizer built on them (or None: forward only); the
    strategy casts the model to the training dtype itself when it needs to (after taking its
    fp32 masters).
    """
    if optimizer is None:  # forward only: evaluation, a frozen reference model
        return build_no_optimizer_strategy(model, cfg, comm, precision)
    strategy = _build(model, optimizer, cfg, comm, precision)
    strategy.average_gradients = cfg.gradient_allreduce_op != "sum"
    return strategy


def _build(model, optimizer, cfg, comm, precision) -> OptimizerStrategy:
    zero = cfg.zero_optimization
    if hasattr(optimizer, "wants_grad_allreduce"):  # a 1-bit optimizer, maybe the user's own
        problems = onebit_problems(type(optimizer).__name__, zero.stage,
                                   zero.offload_optimizer.device)
        for key, value, bad in (("gradient_allreduce_op", cfg.gradient_allreduce_op, "sum"),
                                ("managed_gradient_accumulation",
                                 cfg.managed_gradient_accumulation, False)):
            if value == bad:
                problems.append(f"{key}: {value!r} cannot be used with "
                                f"{type(optimizer).__name__}")
        if problems:
            raise ValueError("; ".join(problems))
        # imported here, not at the top: onebit/strategy.py builds on this package's stage 0
        from dslaunch.engine.zero.onebit_strategy import OneBitStrategy

        return OneBitStrategy(model, optimizer, zero, comm, precision,
                              prescale_gradients=cfg.prescale_gradients,
                              gradient_predivide_factor=cfg.gradient_predivide_factor)
    if zero.stage == 0:
        return Stage0Strategy(model, optimizer, zero, comm, precision,
                              prescale_gradients=cfg.prescale_gradients,
                              gradient_predivide_factor=cfg.gradient_predivide_factor)
    cls = STRATEGIES[zero.stage]
    if zero.offload_optimizer.device == "nvme":  # the offload path, its states swapped to files
        cls = with_nvme_swap(cls)
    return cls(model, optimizer, zero, comm, precision, aio=cfg.aio)


__all__ = ["OptimizerStrategy", "STRATEGIES", "build_optimizer_strategy"]
