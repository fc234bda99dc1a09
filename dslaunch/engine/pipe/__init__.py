"""Pipeline parallelism: ``PipelineModule`` / ``LayerSpec`` / ``TiedLayerSpec`` (module.py),
schedules as instruction streams (schedule.py), p2p transfers (p2p.py), ``PipelineEngine``
(engine.py)."""

from .module import LayerSpec, PipelineModule, TiedLayerSpec, partition_balanced

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec", "partition_balanced",
           "PipelineEngine"]


def __getattr__(name):
    if name == "PipelineEngine":
        from .engine import PipelineEngine
        return PipelineEngine
    raise AttributeError(name)
