"""DeepSpeed's ``data_sampling.variable_batch_size_and_lr``: dynamic batching, micro-batches packed
by sequence length under a token budget and an LR scheduler scaled by each batch's size; a
library the script calls (the engine does not read ``dynamic_batching``), as in DeepSpeed.
Implemented in ``dslaunch.engine.features.data_efficiency.variable_batch``."""

from dslaunch.engine.features.data_efficiency import variable_batch as _impl
from dslaunch.engine.features.data_efficiency.variable_batch import *  # noqa: F403


def __getattr__(name):  # the implementation's other names; else a DeepSpeed name we lack
    if not name.startswith("__") and hasattr(_impl, name):
        return getattr(_impl, name)
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
