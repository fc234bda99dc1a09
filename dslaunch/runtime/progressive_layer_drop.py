"""``dslaunch.runtime.progressive_layer_drop``, as ``deepspeed.runtime.progressive_layer_drop``
(DeepSpeed 0.18 and before): the PLD schedule. A face: the implementation is
``dslaunch/engine/features/progressive_layer_drop.py``.
"""

from dslaunch.engine.features.progressive_layer_drop import ProgressiveLayerDrop

__all__ = ["ProgressiveLayerDrop"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
