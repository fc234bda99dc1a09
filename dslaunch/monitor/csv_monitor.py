"""``deepspeed.monitor.csv_monitor``: ``csvMonitor`` (a face: the class is ``monitor.py``'s)."""

from dslaunch.monitor.monitor import csvMonitor

__all__ = ["csvMonitor"]
