"""``dslaunch.accelerator``, as ``deepspeed.accelerator``: ``get_accelerator()`` is the one object
that answers the device questions (names, seeds and RNG state, streams, memory, dtypes, the
collective backend, compiled ops) for this process, CPU or CUDA.

A real module, not a face: the engine and the kernels use it too. Files: ``abstract.py`` (the
interface, and what follows from a device's answers), ``cpu.py``, ``cuda.py``,
``real_accelerator.py`` (the choice, once per process; ``DSLAUNCH_ACCELERATOR=cpu|cuda``).
"""

from dslaunch.accelerator.abstract import Accelerator
from dslaunch.accelerator.real_accelerator import get_accelerator, set_accelerator
from dslaunch.deepspeed_names import face_getattr

__all__ = ["Accelerator", "get_accelerator", "set_accelerator"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
