"""``dslaunch.pipe``: DeepSpeed's ``deepspeed.pipe`` names (``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, the topologies)."""

from dslaunch.engine.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
from dslaunch.engine.topology import (  # noqa: F401
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology",
           "PipeDataParallelTopology", "PipeModelDataParallelTopology"]
