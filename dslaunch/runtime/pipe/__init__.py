"""``dslaunch.runtime.pipe``, as ``deepspeed.runtime.pipe``: ``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, ``ProcessTopology`` (the same objects as ``dslaunch.pipe``), and the
``engine`` submodule (``PipelineEngine``).

A face: the implementation is ``dslaunch/engine/parallel/pipe/`` and ``dslaunch/engine/parallel/topology.py``.
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.engine.parallel.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from dslaunch.engine.parallel.topology import ProcessTopology

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
