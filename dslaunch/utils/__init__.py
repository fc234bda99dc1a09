"""``dslaunch.utils``, as ``deepspeed.utils``: the logger (``logger``, ``log_dist``), the parallel
groups (``groups``), ``RepeatingLoader``, whole values of ZeRO-partitioned parameters
(``safe_get_full_fp32_param`` and family), ZeRO-3 leaf modules (``set_z3_leaf_modules``), and
``zero_to_fp32`` (a checkpoint as one fp32 state_dict).

A face: the implementations are ``engine/base/log.py``, ``engine/parallel/groups.py``,
``engine/base/dataloader.py``, ``engine/zero/param_access.py``, ``engine/zero/leaf_modules.py`` and
``engine/checkpoint/fp32_state.py``.
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.engine.base.dataloader import RepeatingLoader
from dslaunch.engine.base.log import log_dist, logger
from dslaunch.engine.zero.leaf_modules import (
    get_z3_leaf_modules,
    set_z3_leaf_modules,
    unset_z3_leaf_modules,
    z3_leaf_module,
)
from dslaunch.engine.zero.param_access import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
)

from . import groups, logging, zero_to_fp32

__all__ = ["logger", "log_dist", "groups", "logging", "zero_to_fp32", "RepeatingLoader",
           "safe_get_full_fp32_param", "safe_set_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "z3_leaf_module",
           "get_z3_leaf_modules"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
