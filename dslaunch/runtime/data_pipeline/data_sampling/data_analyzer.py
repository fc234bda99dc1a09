"""DeepSpeed's ``data_sampling.data_analyzer``: offline per-sample metrics (map over workers, reduce into index files).
Implemented in ``dslaunch.engine.features.data_efficiency.data_analyzer``."""

from dslaunch.engine.features.data_efficiency import data_analyzer as _impl
from dslaunch.engine.features.data_efficiency.data_analyzer import *  # noqa: F403


def __getattr__(name):  # the implementation's other names; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
