"""Typed, frozen config sections, generated from the key tree in ``schema.py``.

``schema.py`` stays the one declaration of every key: each ``Section`` there becomes a frozen
dataclass here whose fields are its keys (the JSON spelling, so ``grep zero_optimization`` leads
from a config file to every use), typed from the ``Leaf`` kinds. The resolved values fill them
once per process (``ResolvedConfig.typed``), and each part of the engine receives the section it
needs: ``cfg.zero_optimization.stage``, ``cfg.zero_optimization.offload_optimizer.device``,
``cfg.aio``, ``cfg.pipeline``...

- A section whose values are free keyword arguments (``optimizer.params``: any torch.optim
  keyword; ``scheduler.params``: checked against the scheduler type) is a read-only mapping.
- An open section (``tensor_parallel``, the feature sections we only switch on or off) keeps
  the keys it does not declare in ``extra``, a read-only mapping.
- Lists become tuples and free-form trees read-only mappings, so nothing can be changed after
  resolution: a value has one meaning for the whole run.

Pure data, like the rest of ``config/``: no torch, no engine.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping, Optional

from .schema import TOP, Leaf, Section

_KIND_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "floats": tuple, "ints": tuple,
               "any": Any}
_CLASSES: dict = {}  # id(Section) -> its generated dataclass


def _class_name(path: str) -> str:
    words = path.replace(".", "_").split("_") if path else ["ds"]
    return "".join(w[:1].upper() + w[1:] for w in words) + ("Config" if not path else "Section")


def section_class(spec: Section, path: str = "") -> type:
    """The frozen dataclass of ``spec`` (one per Section, made on first use)."""
    cls = _CLASSES.get(id(spec))
    if cls is not None:
        return cls
    fields = []
    for name, sub in spec.fields.items():
        if isinstance(sub, Section):
            kind = Mapping[str, Any] if not sub.fill else section_class(sub, _join(path, name))
            fields.append((name, Optional[kind] if sub.optional else kind))
        else:
            fields.append((name, Optional[_KIND_TYPES[sub.kind]]))
    if spec.open:
        fields.append(("extra", Mapping[str, Any]))
    cls = dataclasses.make_dataclass(
        _class_name(path), fields, frozen=True,
        namespace={"__doc__": f"The ``{path or 'top-level'}`` config section (typed, frozen).",
                   "to_dict": to_dict})
    _CLASSES[id(spec)] = cls
    return cls


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def build(values: dict, spec: Section = TOP, path: str = ""):
    """The typed object of ``spec`` filled from resolved ``values`` (a validated value tree)."""
    if not spec.fill:  # free keyword arguments (optimizer params)
        return _freeze(values or {})
    cls = section_class(spec, path)
    kwargs = {}
    for name, sub in spec.fields.items():
        value = values.get(name)
        if isinstance(sub, Section):
            kwargs[name] = None if value is None else build(value, sub, _join(path, name))
        else:
            kwargs[name] = _leaf(sub, value)
    if spec.open:
        kwargs["extra"] = _freeze({k: v for k, v in values.items() if k not in spec.fields})
    return cls(**kwargs)


def _leaf(spec: Leaf, value):
    if spec.kind == "floats" and value is not None:
        return tuple(value)
    return _freeze(value)


def _freeze(value):
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def to_dict(section) -> dict:
    """A section (or any frozen value) back as plain JSON-able data: for logs and checkpoints."""
    if dataclasses.is_dataclass(section):
        out = {}
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name == "extra" and isinstance(value, Mapping):
                out.update(to_dict(value))
            else:
                out[f.name] = to_dict(value)
        return out
    if isinstance(section, Mapping):
        return {k: to_dict(v) for k, v in section.items()}
    if isinstance(section, tuple):
        return [to_dict(v) for v in section]
    return section
