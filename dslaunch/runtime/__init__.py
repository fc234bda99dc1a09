"""``dslaunch.runtime``, as ``deepspeed.runtime``: faces for the runtime modules that scripts
import by their runtime path (``runtime.engine``, ``runtime.pipe``, ``runtime.lr_schedules``,
``runtime.base_optimizer``,
``runtime.zero``, ``runtime.utils``, ``runtime.dataloader``, ``runtime.sequence_parallel``), not a mirror of DeepSpeed's
package. Which names answer, and from where, is ``dslaunch/deepspeed_names.py``.
"""

_SUBMODULES = ("activation_checkpointing", "base_optimizer", "dataloader", "engine", "lr_schedules",
               "pipe", "sequence_parallel", "utils", "zero")


def __getattr__(name):  # deepspeed.runtime.engine.X after `import deepspeed` works too
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
