"""``deepspeed.runtime.data_pipeline.data_routing.basic_layer``: the random-LTD layer wrapper
(``dslaunch/engine/features/random_ltd/layer.py``)."""

from dslaunch.engine.features.random_ltd.layer import RandomLayerTokenDrop

__all__ = ["RandomLayerTokenDrop"]
