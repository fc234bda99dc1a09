"""Page-aligned, locked host tensors for direct I/O (DeepSpeed's pin manager and its
``PinMemoryBuilder().load().pin_handle()``).

One registry per process, shared by every ``AsyncIOHandle`` and ``pin_handle``: any of them
recognizes (``is_pinned``) and frees a tensor another one allocated, as DeepSpeed's handles share
their pin manager. A tensor is pinned with CUDA's allocator where CUDA is available, else locked
with mlock(2) when RLIMIT_MEMLOCK allows (unlocked otherwise: still page-aligned, so O_DIRECT
needs no bounce buffer).
"""

from __future__ import annotations

import ctypes
import threading

ALIGN = 4096
_REGISTRY: dict[int, tuple] = {}  # data_ptr -> (base tensor, nbytes, mlocked)
_MUTEX = threading.Lock()
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mlock.argtypes = _LIBC.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return _LIBC


def new_cpu_locked_tensor(num_elem: int, dtype_or_tensor):
    """A page-aligned CPU tensor of ``num_elem`` elements of the dtype (or an example tensor's)."""
    import torch

    if isinstance(num_elem, bool) or not isinstance(num_elem, int) or num_elem < 0:
        raise ValueError(f"num_elem must be an integer >= 0, got {num_elem!r}")
    dtype = dtype_or_tensor.dtype if isinstance(dtype_or_tensor, torch.Tensor) else dtype_or_tensor
    nbytes = num_elem * torch.empty((), dtype=dtype).element_size()
    if torch.cuda.is_available():
        base = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        skew, locked = 0, False
    else:
        base = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
        skew = (-base.data_ptr()) % ALIGN
        locked = nbytes > 0 and _libc().mlock(ctypes.c_void_p(base.data_ptr() + skew),
                                              ctypes.c_size_t(nbytes)) == 0
    out = base[skew:skew + nbytes].view(dtype)
    with _MUTEX:
        _REGISTRY[out.data_ptr()] = (base, nbytes, locked)
    return out


def free_cpu_locked_tensor(tensor) -> bool:
    """Release a tensor from new_cpu_locked_tensor (munlock); False if it was not one."""
    return free_address(tensor.data_ptr())


def free_address(ptr: int) -> bool:
    """free_cpu_locked_tensor by the tensor's data_ptr (a handle closing frees what it made)."""
    with _MUTEX:
        entry = _REGISTRY.pop(ptr, None)
    if entry is None:
        return False
    _base, nbytes, locked = entry
    if locked:
        _libc().munlock(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes))
    return True


def is_locked(tensor) -> bool:
    """Whether ``tensor`` came from new_cpu_locked_tensor and mlock(2) took."""
    entry = _REGISTRY.get(tensor.data_ptr())
    return bool(entry and entry[2])


def is_pinned(tensor) -> bool:
    """Usable for direct I/O without a bounce copy: pinned by torch, or from
    new_cpu_locked_tensor (any handle's)."""
    return bool(tensor.is_pinned() or tensor.data_ptr() in _REGISTRY)


class pin_handle:  # DeepSpeed's name
    """DeepSpeed's standalone pin handle: the three calls, over the process's registry."""

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor):
        return new_cpu_locked_tensor(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor) -> bool:
        return free_cpu_locked_tensor(tensor)

    def is_pinned(self, tensor) -> bool:
        return is_pinned(tensor)
