"""dslaunch's config: load DeepSpeed JSON/YAML configs, validate them, resolve the batch triad and
"auto" values. Pure data: nothing here imports torch (the launcher uses it and must start fast).

    from dslaunch.config import ConfigError, load_config, resolve_config, ResolvedConfig
"""

from .errors import ConfigError
from .loader import load_config
from .resolve import ResolvedConfig, resolve_config

__all__ = ["ConfigError", "load_config", "resolve_config", "ResolvedConfig"]
