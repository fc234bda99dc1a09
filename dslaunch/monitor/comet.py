"""``deepspeed.monitor.comet``: ``CometMonitor`` (a face: the class is ``monitor.py``'s)."""

from dslaunch.monitor.monitor import CometMonitor

__all__ = ["CometMonitor"]
