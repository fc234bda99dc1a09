"""DeepSpeed's op-builder shape over :mod:`dslaunch.kernels.builder`: code that asks
``get_accelerator().create_op_builder("CPUAdamBuilder").load()`` gets dslaunch's compiled op.

A builder class names one of our ops (``NAME``, ``KIND``); ``load()`` builds (or finds in the
cache) and imports it, raising what :func:`builder.load` raises, as DeepSpeed's ``load`` does;
callers that want a warning and a torch fall-back instead use :func:`dslaunch.kernels.load_op`.
The module a dslaunch op exposes is dslaunch's own (``cpu_optim.py``, ``cuda_ops.py`` show its
calls), not DeepSpeed's binding.
"""

from __future__ import annotations

from dslaunch.kernels.ops import OPS

# DeepSpeed's builder class name -> our op (only where the op does the same job)
DEEPSPEED_BUILDERS = {
    "CPUAdamBuilder": "cpu_adam",
    "CPUAdagradBuilder": "cpu_adagrad",
    "CPULionBuilder": "cpu_lion",
    "AsyncIOBuilder": "async_io",
    "FusedAdamBuilder": "cuda_fused_adam",
}
# DeepSpeed's builders with no dslaunch op: importable, never compatible, load() says what to use
NO_OP = {
    "GDSBuilder": "dslaunch has no GPUDirect Storage (cuFile) op; AsyncIOBuilder().load()"
                  ".aio_handle(...) takes the same calls (on host tensors)",
    "FusedLambBuilder": "dslaunch has no compiled LAMB op; deepspeed.ops.lamb.FusedLamb "
                        "(dslaunch.ops.lamb) runs LAMB in torch ops on any device",
    "FusedLionBuilder": "dslaunch has no CUDA Lion op; deepspeed.ops.lion.FusedLion "
                        "(dslaunch.ops.lion) runs the CPU op or torch ops",
}


class OpBuilder:
    """Builds and loads one dslaunch op (``NAME``) of kind ``KIND`` (``"cpu"`` or ``"cuda"``)."""

    NAME = ""
    KIND = ""

    def __init__(self):
        self.name = self.NAME

    def absolute_name(self) -> str:
        return f"dslaunch.kernels.{self.NAME}"

    def sources(self) -> list[str]:
        """Source files, relative to the source root (``cpp/``)."""
        return list(OPS[self.NAME].sources)

    def is_compatible(self, verbose: bool = False) -> bool:
        """Whether the op can be built and run here (never builds)."""
        from dslaunch.kernels import builder

        status = builder.op_status(self.NAME)
        if verbose and not status["compatible"]:
            print(f"dslaunch op {self.NAME}: {status['status']}: {status['reason']}")
        return bool(status["compatible"])

    def load(self, verbose: bool = True):
        """The op's module, built first if the cache has none."""
        from dslaunch.kernels import builder

        return builder.load(self.NAME, quiet=not verbose)

    def jit_load(self, verbose: bool = True):
        return self.load(verbose)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: dslaunch op {self.NAME} ({self.KIND})>"


class NoOpBuilder(OpBuilder):
    """A DeepSpeed builder dslaunch has no op for (``NO_OP``): ``is_compatible()`` is False and
    ``load()`` raises OpUnavailable saying what to use instead."""

    KIND = "none"

    def absolute_name(self) -> str:
        return f"dslaunch.kernels.{type(self).__name__}"

    def sources(self) -> list[str]:
        return []

    def is_compatible(self, verbose: bool = False) -> bool:
        if verbose:
            print(f"{type(self).__name__}: {NO_OP[type(self).__name__]}")
        return False

    def load(self, verbose: bool = True):
        from dslaunch.kernels.builder import OpUnavailable

        raise OpUnavailable(f"{type(self).__name__}: {NO_OP[type(self).__name__]}")


_CLASSES: dict[str, type] = {}


def builder_class(name: str):
    """The builder class for a DeepSpeed builder name or one of our op names; None when we have
    no such op (a ``NO_OP`` name gets a NoOpBuilder, whose KIND no accelerator runs)."""
    if name in NO_OP:
        if name not in _CLASSES:
            _CLASSES[name] = type(name, (NoOpBuilder,), {"__module__": __name__})
        return _CLASSES[name]
    op = DEEPSPEED_BUILDERS.get(name, name if name in OPS else None)
    if op is None:
        return None
    if name not in _CLASSES:
        _CLASSES[name] = type(name, (OpBuilder,), {"NAME": op, "KIND": OPS[op].kind,
                                                   "__module__": __name__})
    return _CLASSES[name]
