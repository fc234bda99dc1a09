"""DeepSpeed's enums of offload settings, importable by the names scripts use
(``deepspeed.runtime.zero.offload_config``). String enums: a member equals its config string
(``OffloadDeviceEnum.cpu == "cpu"``)."""

from __future__ import annotations

import enum


class OffloadDeviceEnum(str, enum.Enum):
    """Where ``offload_optimizer`` / ``offload_param`` put the states: the ``device`` values."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, enum.Enum):
    """The state kinds ``engine.offload_states(include=...)`` moves, DeepSpeed's names (what each
    means for dslaunch's strategies: ``engine/zero/offload_states.py``)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"
