"""``dslaunch.moe.sharded_moe``, as ``deepspeed.moe.sharded_moe``: the gates and the layer that
dispatches tokens to experts. A face: the implementations are ``dslaunch/engine/parallel/moe/gating.py``,
``dispatch.py`` and ``layer.py``."""

from dslaunch.engine.parallel.moe.dispatch import AllToAll as _AllToAll  # noqa: F401
from dslaunch.engine.parallel.moe.gating import (  # noqa: F401
    TopKGate,
    _capacity,
    gumbel_rsample,
    multiplicative_jitter,
    top1gating,
    top2gating,
    topkgating,
)
from dslaunch.engine.parallel.moe.layer import MOELayer  # noqa: F401
