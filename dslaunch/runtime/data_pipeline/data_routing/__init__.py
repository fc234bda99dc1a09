"""``dslaunch.runtime.data_pipeline.data_routing``, as DeepSpeed's: random layer-wise token
dropping (``basic_layer.RandomLayerTokenDrop``, ``helper.convert_to_random_ltd``,
``scheduler.RandomLTDScheduler``). A face: the implementation is ``dslaunch/engine/features/random_ltd/``.
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)
