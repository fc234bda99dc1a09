"""NVIDIA GPUs through torch.cuda, collectives over NCCL.

Every answer is torch.cuda's own; nothing here touches the GPU at import or construction, so the
class is importable (and its names answer) on a machine without one. ``device_index=None`` means
the current device throughout, as in torch.cuda.
"""

from __future__ import annotations

import importlib.util

import torch

from dslaunch.accelerator.abstract import Accelerator

# Triton kernels are only trusted where dslaunch builds its own CUDA ops (sm_80 and newer:
# kernels/builder.py CUDA_ARCHS).
_TRITON_MIN_CAPABILITY = (8, 0)


class CUDAAccelerator(Accelerator):
    _name = "cuda"
    _communication_backend_name = "nccl"
    _op_kinds = ("cpu", "cuda")  # the host-side ops (CPU Adam for offload, async I/O) run too

    # -- the device
    def device_name(self, device_index=None) -> str:
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}"

    def set_device(self, device_index) -> None:
        torch.cuda.set_device(device_index)

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def synchronize(self, device_index=None) -> None:
        torch.cuda.synchronize(device_index)

    def is_synchronized_device(self) -> bool:
        return False

    # -- random numbers
    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed()

    def seed(self) -> None:
        torch.cuda.seed()

    def get_rng_state(self, device_index=None) -> torch.Tensor:
        return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)

    def set_rng_state(self, new_state, device_index=None) -> None:
        torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)

    def default_generator(self, device_index=None) -> torch.Generator:
        index = torch.cuda.current_device() if device_index is None else device_index
        return torch.cuda.default_generators[index]

    # -- streams and events
    @property
    def Stream(self):
        return torch.cuda.Stream

    @property
    def Event(self):
        return torch.cuda.Event

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    # -- memory
    def memory_allocated(self, device_index=None) -> int:
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None) -> int:
        return torch.cuda.max_memory_allocated(device_index)

    def reset_peak_memory_stats(self, device_index=None) -> None:
        torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None) -> int:
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None) -> int:
        return torch.cuda.max_memory_reserved(device_index)

    def total_memory(self, device_index=None) -> int:
        return torch.cuda.get_device_properties(device_index).total_memory

    def available_memory(self, device_index=None) -> int:
        return torch.cuda.mem_get_info(device_index)[0]

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_stats(self, device_index=None) -> dict:
        return dict(torch.cuda.memory_stats(device_index))

    # -- dtypes
    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        return True  # every GPU torch.cuda runs on computes fp16

    def is_triton_supported(self) -> bool:
        if importlib.util.find_spec("triton") is None:
            return False
        return torch.cuda.get_device_capability() >= _TRITON_MIN_CAPABILITY

    def amp(self):
        return torch.cuda.amp

    # -- tensors
    def pin_memory(self, tensor, align_bytes: int = 1):
        return tensor.pin_memory()

    def is_pinned(self, tensor) -> bool:
        return tensor.is_pinned()

    # -- environment
    def export_envs(self) -> list[str]:
        return ["NCCL"]

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def lazy_call(self, callback) -> None:
        # before CUDA is initialised (seeding at import time), torch queues the call until it is
        lazy = getattr(torch.cuda, "_lazy_call", None)
        if lazy is None:
            callback()
        else:
            lazy(callback)

    def range_push(self, msg: str) -> None:
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self) -> None:
        torch.cuda.nvtx.range_pop()
