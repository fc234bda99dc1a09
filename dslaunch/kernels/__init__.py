"""Compiled ops (C++/CUDA under cpp/), built and cached by :mod:`dslaunch.kernels.builder`.

``load_op(name) -> module | None``: None plus one warning when the op cannot be had, so callers
fall back to torch. This package knows nothing of the engine. See README.md beside this file.
"""


def load_op(name: str):
    from dslaunch.kernels.builder import load_op as _load_op

    return _load_op(name)


__all__ = ["load_op"]
