"""Check a raw config dict against the key tree in ``schema.py``.

Collects every problem (unknown keys with the nearest valid key, wrong types, out-of-range values,
missing required keys) instead of stopping at the first, and builds the full value tree with
defaults filled in plus where each value came from ("file" or "default"). Values written as
"auto" are kept as "auto" and listed in ``Checked.autos`` for ``auto.py`` to resolve.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .dotted import expand_dotted_keys
from .schema import (
    DEEPSPEED_OPTIMIZERS,
    SCHEDULER_PARAMS,
    TOP,
    TORCH_OPTIMIZERS,
    Leaf,
    Section,
    all_key_paths,
)

AUTO = "auto"


@dataclass
class Checked:
    values: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    autos: list = field(default_factory=list)  # dotted paths whose value is "auto"
    rewrites: list = field(default_factory=list)  # dotted top-level keys read nested (dotted.py)

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")


def show(value: Any) -> str:
    """A value as the user wrote it (JSON spelling)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_config(raw: dict) -> Checked:
    ck = Checked()
    raw = expand_dotted_keys(dict(raw), ck.problems, ck.rewrites)
    # DeepSpeed's oldest spelling: "zero_optimization": true means stage 1.
    if isinstance(raw.get("zero_optimization"), bool):
        raw["zero_optimization"] = {"stage": int(raw["zero_optimization"])}
    ck.values = _walk(TOP, raw, "", ck)
    _check_optimizer(ck)
    _check_scheduler(raw.get("scheduler"), ck)
    return ck


def _walk(spec: Section, raw: dict, prefix: str, ck: Checked) -> dict:
    given = dict(raw)
    for alias, canonical in spec.aliases.items():
        if alias not in given:
            continue
        value = given.pop(alias)
        if canonical in given and given[canonical] != value:
            ck.problem(prefix + alias, f"{show(value)} conflicts with {prefix}{canonical}="
                       f"{show(given[canonical])} ({alias} is another name for {canonical}); keep one")
        given.setdefault(canonical, value)

    values = {}
    for key, value in given.items():
        if key in spec.fields:
            continue
        if spec.open:
            values[key] = value
            ck.sources[prefix + key] = "file"
            if value == AUTO:
                ck.autos.append(prefix + key)
        else:
            ck.problems.append(unknown_key_message(prefix, key, spec))

    for name, sub in spec.fields.items():
        path = prefix + name
        if isinstance(sub, Section):
            if given.get(name) is None:  # absent or null: all defaults (optional sections stay None)
                values[name] = None if sub.optional else _walk(sub, {}, path + ".", ck)
                if sub.optional:
                    ck.sources[path] = "default"
                continue
            if not isinstance(given[name], dict):
                ck.problem(path, f"expected a section (a mapping of keys), got {show(given[name])}")
                values[name] = None if sub.optional else _walk(sub, {}, path + ".", Checked())
                continue
            values[name] = _walk(sub, given[name], path + ".", ck)
        elif name in given:
            values[name] = _check_value(sub, given[name], path, ck)
        elif spec.fill or sub.required:
            if sub.required:
                ck.problem(path, f"missing; put {sub.describe()} here")
            values[name] = sub.default
            ck.sources[path] = "default"
    return values


def _check_value(spec: Leaf, value: Any, path: str, ck: Checked) -> Any:
    if isinstance(value, str) and value == AUTO:
        ck.autos.append(path)
        ck.sources[path] = "auto"
        return AUTO
    ck.sources[path] = "file"
    ok, converted = check_leaf(spec, value)
    if ok:
        return converted
    hint = ""
    if spec.choices and isinstance(value, str):
        near = difflib.get_close_matches(value, [c for c in spec.choices if isinstance(c, str)], n=1)
        if not near:  # a case slip ("adamw", "CPU") is the usual mistake
            near = [c for c in spec.choices if isinstance(c, str) and c.lower() == value.lower()]
        if near:
            hint = f" (did you mean {show(near[0])}?)"
    ck.problem(path, f"{show(value)} is not allowed; expected {spec.describe()}{hint}")
    return spec.default


def _as_number(value: Any):
    """A number from an int, float or numeric string (not a bool); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    if isinstance(number, float) and not math.isfinite(number):
        return None
    return number


def check_leaf(spec: Leaf, value: Any):
    """(True, value converted to the field's type) or (False, None)."""
    if value is None:
        return (spec.default is None and not spec.required), None
    kind = spec.kind
    if kind == "any":
        return True, value
    if kind == "bool":
        if isinstance(value, bool):
            return True, value
        if isinstance(value, int) and value in (0, 1):
            return True, bool(value)
        return False, None
    if kind == "str":
        if not isinstance(value, str):
            return False, None
        return (spec.choices is None or value in spec.choices), value
    if kind in ("int", "float"):
        if spec.infinity and isinstance(value, float) and value == math.inf:
            return True, value
        number = _as_number(value)
        if number is None:
            return False, None
        if kind == "int":
            if isinstance(number, float):
                if not number.is_integer():
                    return False, None
                number = int(number)
        else:
            number = float(number)
        return _in_range(spec, number), number
    if kind == "ints":  # a list of integers (integral floats accepted) within [low, high]
        if not isinstance(value, (list, tuple)) or (spec.length and len(value) != spec.length):
            return False, None
        numbers = [None if isinstance(v, bool) else _as_number(v) for v in value]
        if any(n is None or float(n) != int(n) or not _in_range(spec, n) for n in numbers):
            return False, None
        return True, [int(n) for n in numbers]
    if kind == "floats":
        if not isinstance(value, (list, tuple)) or (spec.length and len(value) != spec.length):
            return False, None
        numbers = [_as_number(v) for v in value]
        if any(n is None or not _in_range(spec, n) for n in numbers):
            return False, None
        return True, [float(n) for n in numbers]
    raise AssertionError(f"unknown field kind {kind}")


def _in_range(spec: Leaf, number) -> bool:
    return (spec.low is None or number >= spec.low) and (spec.high is None or number <= spec.high)


def unknown_key_message(prefix: str, key: str, spec: Section) -> str:
    candidates = list(spec.fields) + list(spec.aliases)
    if not isinstance(key, str):
        return f"{prefix}{key!r}: keys must be strings"
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if near:
        return f"{prefix}{key}: unknown key; did you mean {near[0]}?"
    elsewhere = [p for p in all_key_paths() if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"{prefix}{key}: unknown key here; it belongs in {elsewhere[0]}"
    if len(candidates) <= 12:
        return f"{prefix}{key}: unknown key; allowed here: {', '.join(spec.fields)}"
    return f"{prefix}{key}: unknown key (see DeepSpeed's configuration reference for the valid keys)"


_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")


def _check_optimizer(ck: Checked) -> None:
    """optimizer.type: DeepSpeed's names (any case) or a name that looks like a torch.optim class."""
    opt = ck.values.get("optimizer")
    if not opt or not isinstance(opt.get("type"), str) or opt["type"] == AUTO:
        return
    name = opt["type"]
    if name.lower() in DEEPSPEED_OPTIMIZERS:
        opt["type"] = DEEPSPEED_OPTIMIZERS[name.lower()]
        return
    if name in TORCH_OPTIMIZERS:
        return
    known = sorted(set(DEEPSPEED_OPTIMIZERS.values()) | set(TORCH_OPTIMIZERS))
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if near:
        ck.problem("optimizer.type", f"{show(name)} is not a known optimizer; did you mean {near[0]}?")
    elif not _CLASS_NAME.match(name):
        ck.problem("optimizer.type", f"{show(name)} is not an optimizer name; use one of DeepSpeed's "
                   f"({', '.join(sorted(set(DEEPSPEED_OPTIMIZERS.values())))}) or a torch.optim class name")


def _check_scheduler(raw_scheduler: Any, ck: Checked) -> None:
    sched = ck.values.get("scheduler")
    if not sched:
        return
    ck.sources.pop("scheduler.params", None)
    kind = sched.get("type")
    params = raw_scheduler.get("params", {}) if isinstance(raw_scheduler, dict) else {}
    if params is None:
        params = {}
    if not isinstance(params, dict):
        ck.problem("scheduler.params", f"expected a section (a mapping of keys), got {show(params)}")
        sched["params"] = {}
        return
    if kind not in SCHEDULER_PARAMS:  # the type problem is already reported
        sched["params"] = params
        return
    sched["params"] = _walk(SCHEDULER_PARAMS[kind], params, "scheduler.params.", ck)
