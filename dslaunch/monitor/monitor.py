"""``deepspeed.monitor.monitor``: ``Monitor`` (the base class), ``MonitorMaster`` (every enabled
monitor of a config) and the four monitors with DeepSpeed's constructors (a section each:
``csvMonitor(config.csv_monitor)``), over the engine's monitors: the same files and events
``dslaunch.initialize``'s engine writes. As DeepSpeed's, only global rank 0 writes."""

from __future__ import annotations

from dslaunch.engine.observe import monitor as _engine
from dslaunch.engine.observe import monitor_trackers as _trackers


def _rank() -> int:
    from dslaunch.engine.comm import api as comm_api

    return comm_api.get_rank() if comm_api.is_initialized() else 0


class Monitor:
    """What a monitor is: made from its config section, writes ``(name, value, step)`` events."""

    def __init__(self, monitor_config):
        self.monitor_config = monitor_config

    def write_events(self, event_list) -> None:
        raise NotImplementedError


class _Section(Monitor):
    """One monitor of the engine's, made from its config section on rank 0 when enabled."""

    def _make(self, section):
        raise NotImplementedError

    def __init__(self, section):
        super().__init__(section)
        self.enabled = bool(section.enabled)
        self.impl = self._make(section) if self.enabled and _rank() == 0 else None

    def write_events(self, event_list) -> None:
        if self.impl is not None:
            self.impl.write_events(event_list)

    def close(self) -> None:
        if self.impl is not None:
            self.impl.close()


class csvMonitor(_Section):  # DeepSpeed's name
    def _make(self, section):
        impl = _engine.CSVMonitor(section.output_path, section.job_name)
        self.log_dir = impl.dir
        return impl


class TensorBoardMonitor(_Section):
    def _make(self, section):
        impl = _engine.TensorBoardMonitor(section.output_path, section.job_name)
        self.summary_writer = impl.writer
        return impl


class WandbMonitor(_Section):
    def _make(self, section):
        return _trackers.WandbMonitor(section)


class CometMonitor(_Section):
    def _make(self, section):
        return _trackers.CometMonitor(section)


class MonitorMaster(Monitor):
    """Every monitor ``monitor_config`` (``get_monitor_config(...)``) enables, on rank 0."""

    def __init__(self, monitor_config):
        super().__init__(monitor_config)
        self.enabled = monitor_config.enabled
        self.tb_monitor = self.wandb_monitor = self.csv_monitor = self.comet_monitor = None
        for attr, key, cls in (("tb_monitor", "tensorboard", TensorBoardMonitor),
                               ("wandb_monitor", "wandb", WandbMonitor),
                               ("csv_monitor", "csv_monitor", csvMonitor),
                               ("comet_monitor", "comet", CometMonitor)):
            section = getattr(monitor_config, key)
            if section.enabled and _rank() == 0:
                setattr(self, attr, cls(section))

    def _monitors(self) -> list:
        return [m for m in (self.tb_monitor, self.wandb_monitor, self.csv_monitor,
                            self.comet_monitor) if m is not None]

    def write_events(self, event_list) -> None:
        for m in self._monitors():
            m.write_events(event_list)

    def close(self) -> None:
        for m in self._monitors():
            m.close()
