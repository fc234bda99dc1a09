"""dslaunch's config: load DeepSpeed JSON/YAML configs, validate them, resolve the batch triad and
"auto" values, and hand them out as typed, frozen sections. Pure data: nothing here imports torch
(the launcher uses it and must start fast).

    from dslaunch.config import ConfigError, load_config, resolve_config, ResolvedConfig
    cfg = resolve_config("ds.json", world_size=4).typed
    cfg.zero_optimization.stage, cfg.zero_optimization.offload_optimizer.device, cfg.aio.queue_depth
"""

from .errors import ConfigError
from .loader import load_config
from .resolve import ResolvedConfig, onebit_problems, resolve_config, zero_stage
from .schema import looks_like_deepspeed
from .sections import to_dict

__all__ = ["ConfigError", "load_config", "looks_like_deepspeed", "resolve_config", "ResolvedConfig",
           "onebit_problems", "to_dict", "zero_stage"]
