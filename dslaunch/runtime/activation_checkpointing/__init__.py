"""``dslaunch.runtime.activation_checkpointing``, as ``deepspeed.runtime.activation_checkpointing``:
its ``checkpointing`` module is ``dslaunch.checkpointing`` (the same module object, as
``deepspeed.checkpointing`` is DeepSpeed's)."""


def __getattr__(name):
    import importlib

    if name == "checkpointing":
        return importlib.import_module(f"{__name__}.checkpointing")
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
