"""``dslaunch.runtime.activation_checkpointing.checkpointing``, as DeepSpeed's module of that
path: the same module object as ``dslaunch.checkpointing`` (DeepSpeed's
``deepspeed.checkpointing`` is this module too), so there is one module state."""

import sys

from dslaunch import checkpointing

sys.modules[__name__] = checkpointing  # the import statement hands out dslaunch.checkpointing
