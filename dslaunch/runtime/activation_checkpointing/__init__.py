"""``dslaunch.runtime.activation_checkpointing``, as ``deepspeed.runtime.activation_checkpointing``:
its ``checkpointing`` module is ``dslaunch.checkpointing`` (the same module object, as
``deepspeed.checkpointing`` is DeepSpeed's)."""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
