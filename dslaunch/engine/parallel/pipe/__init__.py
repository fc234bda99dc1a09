"""Pipeline parallelism's modules: ``PipelineModule`` / ``LayerSpec`` / ``TiedLayerSpec``
(module.py), schedules as instruction streams (schedule.py), p2p transfers (p2p.py). The engine
that runs them, ``PipelineEngine``, is the engine's (``core/pipe_engine.py``)."""

from dslaunch.engine.parallel.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec, partition_balanced

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec", "partition_balanced"]
