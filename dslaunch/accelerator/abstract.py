"""The accelerator interface: one object per process answers every device question the runtime
and user code ask (which device, its seeds and RNG state, streams, memory figures, dtypes, the
collective backend, the compiled ops), so that neither has to spell ``torch.cuda`` or guess.

The method names are DeepSpeed's (``get_accelerator().current_device_name()`` etc.), so code
written against ``deepspeed.accelerator`` runs unchanged. What differs between devices is
abstract here; what follows from the device's answers (the timers rule, the dtype list, the
tensor constructors, the op builders, the visible-devices variables) is written once below.
"""

from __future__ import annotations

import abc
import contextlib

import torch


class TensorType:
    """``acc.FloatTensor`` and friends: the legacy ``torch.cuda.FloatTensor`` constructor for the
    accelerator's device, created on the device current at the call.

    ``FloatTensor([1, 2])`` or ``FloatTensor(tensor)`` takes data; ``FloatTensor(2, 3)`` or
    ``FloatTensor(torch.Size([2, 3]))`` makes an uninitialised tensor of that shape (as the
    legacy constructors did); ``FloatTensor()`` an empty one. ``isinstance(t, acc.FloatTensor)``
    holds for a tensor of that dtype on the accelerator's device type.
    """

    def __init__(self, accelerator: Accelerator, dtype: torch.dtype, name: str):
        self._accelerator = accelerator
        self.dtype = dtype
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        device = self._accelerator.current_device_name()
        if kwargs.pop("device", None) is not None:
            raise TypeError(f"{self.__name__}() makes tensors on the accelerator's device; "
                            "use torch.tensor(..., device=...) for another")
        if len(args) == 1 and not isinstance(args[0], (int, torch.Size)):
            data = args[0]
            if isinstance(data, torch.Tensor):
                return data.to(device=device, dtype=self.dtype, **kwargs)
            return torch.tensor(data, dtype=self.dtype, device=device, **kwargs)
        if len(args) == 1 and isinstance(args[0], torch.Size):
            args = tuple(args[0])
        return torch.empty(args if args else (0,), dtype=self.dtype, device=device, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.dtype == self.dtype
                and obj.device.type == self._accelerator._name)

    def __repr__(self) -> str:
        return f"<{self._accelerator._name} {self.__name__}: {self.dtype}>"


class Accelerator(abc.ABC):
    """One device kind (``cpu``, ``cuda``) as the runtime sees it. Use
    :func:`dslaunch.accelerator.get_accelerator` for the process's own."""

    _name: str = ""  # "cpu" / "cuda": a torch device type (DeepSpeed's attribute name)
    _communication_backend_name: str = ""  # torch.distributed backend for this device
    _op_kinds: tuple[str, ...] = ()  # kinds of dslaunch.kernels ops that run here
    _compile_backend: str = "inductor"

    def __repr__(self) -> str:
        return (f"<dslaunch {type(self).__name__} "
                f"({self._name}, {self._communication_backend_name})>")

    # -- the device -------------------------------------------------------------------------------

    @abc.abstractmethod
    def device_name(self, device_index: int | None = None) -> str:
        """A torch device string: ``"cuda"`` / ``"cuda:1"``; ``"cpu"``."""

    @abc.abstractmethod
    def current_device(self):
        """This process's device (an index where the device has several)."""

    @abc.abstractmethod
    def current_device_name(self) -> str:
        """This process's device as a torch device string (use it for ``device=``)."""

    @abc.abstractmethod
    def set_device(self, device_index) -> None: ...

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def is_available(self) -> bool: ...

    @abc.abstractmethod
    def device(self, device_index=None):
        """A context manager making ``device_index`` current inside it (``torch.cuda.device``)."""

    @abc.abstractmethod
    def synchronize(self, device_index=None) -> None:
        """Wait until the device has finished the work queued so far."""

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    @abc.abstractmethod
    def is_synchronized_device(self) -> bool:
        """True where work finishes before the call that queued it returns (no queue to wait on)."""

    # On a synchronized device the host clock times the work, memory is returned as soon as it is
    # freed, and a result is ready when read; elsewhere events, streams and the caching allocator
    # must be asked.
    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    # -- random numbers ----------------------------------------------------------------------------

    def random(self):
        """The torch.random module (``fork_rng``, ``get_rng_state``, ...)."""
        return torch.random

    @abc.abstractmethod
    def manual_seed(self, seed: int) -> None: ...

    @abc.abstractmethod
    def manual_seed_all(self, seed: int) -> None: ...

    @abc.abstractmethod
    def initial_seed(self) -> int: ...

    @abc.abstractmethod
    def seed(self) -> None:
        """Seed the generator with a non-deterministic random number."""

    @abc.abstractmethod
    def get_rng_state(self, device_index=None) -> torch.Tensor: ...

    @abc.abstractmethod
    def set_rng_state(self, new_state: torch.Tensor, device_index=None) -> None: ...

    @abc.abstractmethod
    def default_generator(self, device_index) -> torch.Generator: ...

    # -- streams and events ------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def Stream(self):
        """The stream class: ``acc.Stream()`` makes one."""

    @property
    @abc.abstractmethod
    def Event(self):
        """The event class: ``acc.Event(enable_timing=True)`` makes one."""

    @abc.abstractmethod
    def stream(self, stream):
        """A context manager running the enclosed work on ``stream``."""

    @abc.abstractmethod
    def current_stream(self, device_index=None): ...

    @abc.abstractmethod
    def default_stream(self, device_index=None): ...

    # -- memory (bytes) ----------------------------------------------------------------------------

    @abc.abstractmethod
    def memory_allocated(self, device_index=None) -> int: ...

    @abc.abstractmethod
    def max_memory_allocated(self, device_index=None) -> int:
        """The peak of ``memory_allocated`` since the last ``reset_peak_memory_stats``."""

    @abc.abstractmethod
    def reset_peak_memory_stats(self, device_index=None) -> None: ...

    @abc.abstractmethod
    def memory_reserved(self, device_index=None) -> int:
        """What the process holds of the device's memory (allocated plus cached)."""

    @abc.abstractmethod
    def max_memory_reserved(self, device_index=None) -> int: ...

    @abc.abstractmethod
    def total_memory(self, device_index=None) -> int: ...

    @abc.abstractmethod
    def available_memory(self, device_index=None) -> int: ...

    @abc.abstractmethod
    def empty_cache(self) -> None:
        """Give memory the process holds but no longer uses back to the system."""

    @abc.abstractmethod
    def memory_stats(self, device_index=None) -> dict:
        """At least ``allocated_bytes.all.current|peak`` and ``reserved_bytes.all.current|peak``
        (torch.cuda.memory_stats's keys)."""

    # DeepSpeed's older names
    def memory_cached(self, device_index=None) -> int:
        return self.memory_reserved(device_index)

    def max_memory_cached(self, device_index=None) -> int:
        return self.max_memory_reserved(device_index)

    def reset_max_memory_allocated(self, device_index=None) -> None:
        self.reset_peak_memory_stats(device_index)

    def reset_max_memory_cached(self, device_index=None) -> None:
        self.reset_peak_memory_stats(device_index)

    # -- dtypes, autocast --------------------------------------------------------------------------

    @abc.abstractmethod
    def is_bf16_supported(self) -> bool: ...

    @abc.abstractmethod
    def is_fp16_supported(self) -> bool: ...

    def supported_dtypes(self) -> list:
        """The floating-point dtypes the engine can train in on this device."""
        return ([torch.float32] + ([torch.bfloat16] if self.is_bf16_supported() else [])
                + ([torch.float16] if self.is_fp16_supported() else []))

    @abc.abstractmethod
    def is_triton_supported(self) -> bool: ...

    @abc.abstractmethod
    def amp(self):
        """The device's torch amp module (``torch.cuda.amp`` / ``torch.cpu.amp``)."""

    def autocast(self, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        """``torch.autocast`` for this device type."""
        return torch.autocast(self._name, dtype=dtype, enabled=enabled,
                              cache_enabled=cache_enabled)

    # -- tensors -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        """A host tensor the device can copy from asynchronously."""

    @abc.abstractmethod
    def is_pinned(self, tensor: torch.Tensor) -> bool: ...

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def _tensor_type(self, dtype: torch.dtype, name: str) -> TensorType:
        cache = self.__dict__.setdefault("_tensor_types", {})  # one object per name: `is` holds
        if name not in cache:
            cache[name] = TensorType(self, dtype, name)
        return cache[name]

    @property
    def BFloat16Tensor(self):
        return self._tensor_type(torch.bfloat16, "BFloat16Tensor")

    @property
    def ByteTensor(self):
        return self._tensor_type(torch.uint8, "ByteTensor")

    @property
    def DoubleTensor(self):
        return self._tensor_type(torch.float64, "DoubleTensor")

    @property
    def FloatTensor(self):
        return self._tensor_type(torch.float32, "FloatTensor")

    @property
    def HalfTensor(self):
        return self._tensor_type(torch.float16, "HalfTensor")

    @property
    def IntTensor(self):
        return self._tensor_type(torch.int32, "IntTensor")

    @property
    def LongTensor(self):
        return self._tensor_type(torch.int64, "LongTensor")

    # -- compiled ops ------------------------------------------------------------------------------

    def get_op_builder(self, class_name: str):
        """The builder class for an op that runs on this device: DeepSpeed's builder names
        (``"CPUAdamBuilder"``, ``"FusedAdamBuilder"``, ...) or dslaunch's op names
        (``"cpu_adam"``); None for an op dslaunch does not have or that does not run here."""
        from dslaunch.deepspeed_names import BY_NAME, resolve
        from dslaunch.kernels import op_builder

        row = BY_NAME.get(f"deepspeed.ops.op_builder.{class_name}")  # deepspeed.ops.op_builder's
        cls = resolve(row) if row is not None and row.present else op_builder.builder_class(
            class_name)
        return cls if cls is not None and cls.KIND in self._op_kinds else None

    def create_op_builder(self, class_name: str):
        """An instance of :meth:`get_op_builder`'s class (``.load()``, ``.is_compatible()``), or
        None."""
        cls = self.get_op_builder(class_name)
        return cls() if cls is not None else None

    def build_extension(self):
        """The setuptools command class that builds torch C++/CUDA extensions."""
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension

    # -- processes and environment -----------------------------------------------------------------

    @abc.abstractmethod
    def export_envs(self) -> list[str]:
        """Prefixes of environment variables a multi-node launch should carry to every rank for
        this device (dslaunch's launcher forwards a superset of these on its own)."""

    @abc.abstractmethod
    def visible_devices_envs(self) -> list[str]:
        """The variables that restrict which devices a process sees."""

    def set_visible_devices_envs(self, current_env: dict, local_accelerator_ids) -> None:
        """Make ``local_accelerator_ids`` the devices a process started with ``current_env``
        sees."""
        for name in self.visible_devices_envs():
            current_env[name] = ",".join(str(i) for i in local_accelerator_ids)

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"torch.compile backend {backend!r} is not registered; known: "
                             f"{', '.join(sorted(known))}")
        self._compile_backend = backend

    def lazy_call(self, callback) -> None:
        """Run ``callback`` once the device is initialised (at once where there is nothing to
        wait for)."""
        callback()

    def range_push(self, msg: str) -> None:
        """Open a named range for a profiler timeline (no-op where there is no such tool)."""

    def range_pop(self) -> None:
        """Close the innermost :meth:`range_push` range."""


class NullStream:
    """A stream of a synchronized device: work is done when queued, so every wait is already
    satisfied. Has the methods user code calls on ``torch.cuda.Stream``."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else NullEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __repr__(self) -> str:
        return f"<NullStream device={self.device}>"


class NullEvent:
    """An event of a synchronized device: complete as soon as recorded. It carries no time:
    ``elapsed_time`` raises (time host work with the host clock; ``use_host_timers()`` says
    so)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        raise RuntimeError(
            "elapsed_time: events of a synchronized device (CPU) carry no timestamps; the work "
            "is done when the call returns, so time it with time.perf_counter() "
            "(get_accelerator().use_host_timers() is True here)")


def null_context(value=None):
    """A context manager that does nothing (``stream(s)`` / ``device(i)`` on a device without
    them)."""
    return contextlib.nullcontext(value)
