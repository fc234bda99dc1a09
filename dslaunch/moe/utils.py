"""``dslaunch.moe.utils``, as ``deepspeed.moe.utils``: which parameters are experts' and the
optimizer parameter groups that keep them apart. A face: the implementation is
``dslaunch/engine/parallel/moe/params.py`` (``has_moe_layers``: ``layer.py``)."""

from dslaunch.engine.parallel.moe.layer import has_moe_layers  # noqa: F401
from dslaunch.engine.parallel.moe.params import (  # noqa: F401
    configure_moe_param_groups,
    is_moe_param,
    is_moe_param_group,
    split_params_grads_into_shared_and_expert_params,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)
