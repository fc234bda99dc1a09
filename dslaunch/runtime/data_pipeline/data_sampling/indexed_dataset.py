"""DeepSpeed's ``data_sampling.indexed_dataset``: the ``.bin``/``.idx`` memory-mapped array files.
Implemented in ``dslaunch.engine.features.data_efficiency.indexed_dataset``."""

from dslaunch.engine.features.data_efficiency import indexed_dataset as _impl
from dslaunch.engine.features.data_efficiency.indexed_dataset import *  # noqa: F403


def __getattr__(name):  # the implementation's other names; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
