"""DeepSpeed's ``data_sampling.data_sampler``: ``DeepSpeedDataSampler``, batches whose difficulty follows a curriculum.
Implemented in ``dslaunch.engine.features.data_efficiency.data_sampler``."""

from dslaunch.engine.features.data_efficiency import data_sampler as _impl
from dslaunch.engine.features.data_efficiency.data_sampler import *  # noqa: F403


def __getattr__(name):  # the implementation's other names; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
