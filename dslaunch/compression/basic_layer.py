"""``dslaunch.compression.basic_layer``, as ``deepspeed.compression.basic_layer``: the compressed
layers. A face: the implementation is ``dslaunch/engine/features/compression/layers.py`` and ``conv.py``.
"""

from dslaunch.engine.features.compression.conv import BNLayer_Compress, Conv2dLayer_Compress
from dslaunch.engine.features.compression.layers import LinearLayer_Compress

__all__ = ["LinearLayer_Compress", "Conv2dLayer_Compress", "BNLayer_Compress"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
