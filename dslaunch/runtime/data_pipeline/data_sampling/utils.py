"""DeepSpeed's ``data_sampling.utils``: the helpers the analyzer and sampler share.
Implemented in ``dslaunch.engine.features.data_efficiency.utils``."""

from dslaunch.engine.features.data_efficiency import utils as _impl
from dslaunch.engine.features.data_efficiency.utils import *  # noqa: F403


def __getattr__(name):  # the implementation's other names; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
