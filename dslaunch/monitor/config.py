"""``deepspeed.monitor.config``: the monitor sections of a config dict (``get_monitor_config``),
read and checked by dslaunch's config resolution, the one the engine uses."""

from __future__ import annotations

SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet")


class DeepSpeedMonitorConfig:
    """The four monitor sections (typed, with their defaults) and ``enabled``: any of them is."""

    def __init__(self, typed):
        for key in SECTIONS:
            setattr(self, key, getattr(typed, key))
        self.enabled = any(getattr(self, key).enabled for key in SECTIONS)

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={getattr(self, key)!r}" for key in SECTIONS)
        return f"DeepSpeedMonitorConfig({inner})"


def get_monitor_config(param_dict: dict) -> DeepSpeedMonitorConfig:
    """The monitor sections of ``param_dict`` (a DeepSpeed config dict); other keys are ignored.
    A bad value is dslaunch's ConfigError naming the key."""
    from dslaunch.config import resolve_config

    sections = {key: param_dict[key] for key in SECTIONS if key in param_dict}
    typed = resolve_config(sections, require_batch=False, check_supported=False).typed
    return DeepSpeedMonitorConfig(typed)
