"""``deepspeed.runtime.data_pipeline.data_routing.helper``: wrapping a model's layers and the
state dict without the wrappers (``dslaunch/engine/features/random_ltd/convert.py``)."""

from dslaunch.engine.features.random_ltd.convert import (
    convert_to_random_ltd,
    remove_random_ltd_state_dict,
    save_without_random_ltd,
)

__all__ = ["convert_to_random_ltd", "save_without_random_ltd", "remove_random_ltd_state_dict"]
