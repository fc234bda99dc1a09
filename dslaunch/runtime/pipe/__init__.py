"""``dslaunch.runtime.pipe``, as ``deepspeed.runtime.pipe``: ``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, ``ProcessTopology`` (the same objects as ``dslaunch.pipe``), and the
``engine`` submodule (``PipelineEngine``).

A face: the implementation is ``dslaunch/engine/pipe/`` and ``dslaunch/engine/topology.py``.
"""

from dslaunch.engine.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from dslaunch.engine.topology import ProcessTopology

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology"]


def __getattr__(name):
    import importlib

    if name == "engine":
        return importlib.import_module(f"{__name__}.engine")
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
