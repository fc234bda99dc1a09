"""The process's accelerator, chosen once: ``get_accelerator()`` (also at DeepSpeed's import path
``deepspeed.accelerator.real_accelerator``, which Transformers imports).

The choice: ``DSLAUNCH_ACCELERATOR=cpu|cuda`` if set (else DeepSpeed's ``DS_ACCELERATOR``, so a
DeepSpeed environment keeps working), otherwise CUDA when ``torch.cuda.is_available()``, else the
CPU. A named accelerator that cannot run here is an error, not a silent fall-back: a job told to
use the GPUs must not train on the CPU unnoticed. ``set_accelerator`` replaces the choice (a
framework, a test).
"""

from __future__ import annotations

import os
import threading

ENV = "DSLAUNCH_ACCELERATOR"
DEEPSPEED_ENV = "DS_ACCELERATOR"
KINDS = ("cpu", "cuda")

_accelerator = None
_lock = threading.Lock()


def _requested():
    """(kind, variable that named it), or (None, None) when no variable is set."""
    for name in (ENV, DEEPSPEED_ENV):
        value = os.environ.get(name, "").strip().lower()
        if value:
            if value not in KINDS:
                raise ValueError(f"{name}={os.environ[name]!r}: dslaunch has the accelerators "
                                 f"{', '.join(KINDS)}")
            return value, name
    return None, None


def _create(kind: str):
    if kind == "cuda":
        from dslaunch.accelerator.cuda import CUDAAccelerator

        return CUDAAccelerator()
    from dslaunch.accelerator.cpu import CPUAccelerator

    return CPUAccelerator()


def choose():
    """A new accelerator object by the rule above (``get_accelerator`` keeps the first)."""
    import torch

    kind, variable = _requested()
    if kind is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    elif kind == "cuda" and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else "torch.cuda.is_available() is False (no GPU visible)")
        raise RuntimeError(f"{variable}=cuda but {why}; unset it or set {ENV}=cpu")
    return _create(kind)


def get_accelerator():
    """The accelerator of this process (the same object on every call)."""
    global _accelerator
    if _accelerator is None:
        with _lock:
            if _accelerator is None:
                _accelerator = choose()
    return _accelerator


def set_accelerator(accelerator) -> None:
    """Make ``accelerator`` (an :class:`~dslaunch.accelerator.abstract.Accelerator`) the one
    ``get_accelerator`` returns from now on."""
    from dslaunch.accelerator.abstract import Accelerator

    if not isinstance(accelerator, Accelerator):
        raise TypeError(f"set_accelerator: expected a dslaunch Accelerator, got "
                        f"{type(accelerator).__name__}")
    global _accelerator
    with _lock:
        _accelerator = accelerator


def __getattr__(name):  # a DeepSpeed name we do not provide: say so
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
