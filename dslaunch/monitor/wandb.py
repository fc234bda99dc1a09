"""``deepspeed.monitor.wandb``: ``WandbMonitor`` (a face: the class is ``monitor.py``'s)."""

from dslaunch.monitor.monitor import WandbMonitor

__all__ = ["WandbMonitor"]
