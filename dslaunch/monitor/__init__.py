"""``dslaunch.monitor``, as ``deepspeed.monitor``: the training monitors (CSV, TensorBoard, W&B,
Comet) under DeepSpeed's class names and constructors, for scripts that log their own events::

    from deepspeed.monitor.config import get_monitor_config
    from deepspeed.monitor.monitor import MonitorMaster
    monitor = MonitorMaster(get_monitor_config(ds_config))
    monitor.write_events([("Train/loss", loss, step)])

A face: ``monitor.py`` adapts DeepSpeed's constructors to the engine's monitors
(``dslaunch/engine/observe/monitor.py``, ``monitor_trackers.py``); the submodules are loaded on first use.
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)
