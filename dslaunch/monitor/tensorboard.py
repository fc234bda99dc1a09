"""``deepspeed.monitor.tensorboard``: ``TensorBoardMonitor`` (a face: the class is ``monitor.py``'s)."""

from dslaunch.monitor.monitor import TensorBoardMonitor

__all__ = ["TensorBoardMonitor"]
