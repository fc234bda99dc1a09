"""The 1-bit optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB) and everything only they use.

Modules:

- ``optimizer.py``: ``OneBitOptimizer``, the shared base: step counter, the one compressed
  all-reduce over all parameters, the clamp to Adam's largest step, per-rank state in
  ``state_dict()``; ``check_comm_options`` (DeepSpeed's ``comm_backend_name`` / ``cuda_aware``).
- ``adam.py``: ``OneBitAdam`` (exact Adam warmup, then 1-bit momentum, frozen variance).
- ``zero_one_adam.py``: ``ZeroOneAdam`` (sparse variance updates, then local steps with 1-bit
  syncs of the parameter change).
- ``lamb.py``: ``OneBitLamb`` (exact LAMB warmup, then 1-bit fused momenta, frozen trust ratio
  times a factor).
- ``compressed.py``: ``CompressedAllReduce``, the error-compensated 1-bit average over the
  data-parallel ranks (one all_to_all + one all_gather), with its torch pack/decode kernels (the
  compiled CPU op ``onebit_pack``, ``cpp/cpu/onebit_pack.cpp``, must equal them).
- ``strategy.py``: ``OneBitStrategy``, the ZeRO-stage-0 optimizer strategy that all-reduces
  gradients in full precision only when the optimizer asks for it.

Entry points: ``engine/optim``'s ``build_optimizer`` calls ``build_onebit`` below for the config
types ``OneBitAdam``, ``ZeroOneAdam`` and ``OneBitLamb``; ``engine/zero``'s
``build_optimizer_strategy`` picks ``strategy.OneBitStrategy`` for any optimizer with
``wants_grad_allreduce`` (the user's own 1-bit optimizer too). Which ZeRO settings they cannot
run with is ``dslaunch.config``'s ``onebit_problems``.

One training step (``engine.py`` drives the strategy):

1. ``OneBitStrategy.prepare_backward`` at the accumulation boundary asks the optimizer
   ``wants_grad_allreduce()`` for the coming step (warmup of 1-bit Adam / LAMB, variance steps
   of 0/1 Adam: yes). If not, the stage-0 bucketed gradient all-reduce is switched off and the
   gradients stay local (averaged over the micro-steps only).
2. ``OneBitStrategy.step``: with averaged gradients, stage 0's step; with local ones, the clip
   and fp16-overflow decisions use the ranks' root-mean-square gradient norm, so every rank
   decides alike. Then ``optimizer.step()``.
3. The optimizer's step: exact Adam/LAMB on full-precision steps (0/1 Adam: a variance
   update); otherwise it averages what its algorithm sends through ``compressed_average[_flat]`` ->
   ``CompressedAllReduce`` (1-bit Adam / LAMB: the momentum; 0/1 Adam: the gradient in phase
   1, the change since the last sync every ``local_step_interval`` steps in phase 2), whose
   error buffers carry what the compression lost into the next call.

``strategy`` is not imported here but where it is picked (``engine/zero``, at call time): it
builds on ZeRO's stage 0, and the optimizers and the all-reduce should load without ZeRO.
"""

from __future__ import annotations

import inspect

from dslaunch.engine.optim.onebit.adam import OneBitAdam
from dslaunch.engine.optim.onebit.compressed import CompressedAllReduce
from dslaunch.engine.optim.onebit.lamb import OneBitLamb
from dslaunch.engine.optim.onebit.optimizer import ONE_BIT_TYPES, OneBitOptimizer, check_comm_options, is_onebit
from dslaunch.engine.optim.onebit.zero_one_adam import ZeroOneAdam

_BY_NAME = {"onebitadam": OneBitAdam, "zerooneadam": ZeroOneAdam, "onebitlamb": OneBitLamb}


def build_onebit(model_parameters, name: str, params: dict) -> OneBitOptimizer:
    """The optimizer for config ``optimizer.type`` ``name`` with ``optimizer.params``."""
    cls = _BY_NAME[name.lower()]
    kw = {k: (tuple(v) if k == "betas" else v) for k, v in params.items() if v is not None}
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ValueError(f"optimizer.params.{unknown[0]}: not a parameter of {cls.__name__} "
                         f"(it takes {', '.join(sorted(allowed))})")
    return cls(model_parameters, **kw)


__all__ = ["ONE_BIT_TYPES", "OneBitOptimizer", "OneBitAdam", "ZeroOneAdam", "OneBitLamb",
           "CompressedAllReduce", "build_onebit", "check_comm_options", "is_onebit"]
