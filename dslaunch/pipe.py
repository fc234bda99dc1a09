"""``dslaunch.pipe``: DeepSpeed's ``deepspeed.pipe`` names (``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, the topologies) and ``load_consolidated`` (a ``dslaunch ckpt to-fp32`` file of a
pipeline/TP checkpoint into an unpartitioned ``PipelineModule``)."""

from dslaunch.engine.checkpoint.consolidate import load_consolidated
from dslaunch.engine.parallel.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from dslaunch.engine.parallel.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology",
           "PipeDataParallelTopology", "PipeModelDataParallelTopology", "load_consolidated"]
