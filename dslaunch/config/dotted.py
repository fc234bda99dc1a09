"""Top-level keys written as dotted paths: ``{"zero_optimization.reduce_bucket_size": 1e6}``.

TRL's trainers build the frozen reference model's engine under ZeRO-3 by adding such keys to
the training config (``"zero_optimization.reduce_bucket_size"``,
``"zero_optimization.stage3_param_persistence_threshold"``,
``"zero_optimization.stage3_prefetch_bucket_size"``, sized from the model's hidden size).
DeepSpeed ignores them silently; what TRL means is the nested key, so dslaunch reads each as the
key it names: the dotted value wins over one written nested, and each rewrite is reported once
(``Checked.rewrites``: ``config show`` prints them, the engine logs them on rank 0). A whole
number written as a fraction (TRL's ``0.9 * hidden_size * hidden_size``) for an integer key is
rounded down. A dotted key that names no key of the config is refused, with the nearest path.
"""

from __future__ import annotations

import copy
import difflib
import math

from .schema import TOP, Leaf, Section, all_key_paths


def _canonical_path(parts: list):
    """(canonical parts, the Leaf or Section reached) along the schema, or None where a part
    names nothing. Inside an open section any key is taken as written."""
    spec, out = TOP, []
    for i, part in enumerate(parts):
        if not isinstance(spec, Section):
            return None  # a path that goes on below a scalar key
        name = spec.aliases.get(part, part)
        if name not in spec.fields:
            if spec.open:
                return out + parts[i:], None
            return None
        out.append(name)
        spec = spec.fields[name]
    return out, spec


def expand_dotted_keys(raw: dict, problems: list, rewrites: list) -> dict:
    """``raw`` with its dotted top-level keys moved to the nested keys they name (a new dict;
    ``raw`` is not changed). Refusals go to ``problems``, one line per rewrite to ``rewrites``."""
    dotted = [k for k in raw if isinstance(k, str) and "." in k]
    if not dotted:
        return raw
    out = {k: v for k, v in raw.items() if k not in dotted}
    for key in dotted:
        value = raw[key]
        found = _canonical_path(key.split("."))
        if found is None:
            near = difflib.get_close_matches(key, all_key_paths(), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else \
                "; write the key nested in its section instead"
            problems.append(f"{key}: a dotted key that names no config key{hint}")
            continue
        parts, spec = found
        if isinstance(spec, Leaf) and spec.kind == "int" and isinstance(value, float) and \
                math.isfinite(value) and not value.is_integer():
            value = math.floor(value)
        section = out
        for part in parts[:-1]:
            nested = section.get(part)
            if nested is None:
                nested = {}
            elif isinstance(nested, dict):
                nested = copy.copy(nested)  # the caller's sections stay as they were
            else:
                problems.append(f"{key}: names a key inside {part}, which is not a section here")
                break
            section[part] = nested
            section = nested
        else:
            path = ".".join(parts)
            before = section.get(parts[-1], _ABSENT)
            section[parts[-1]] = value
            was = "" if before is _ABSENT else f" (replacing {before!r} written nested)"
            rewrites.append(f"{key}: read as {path} = {value!r}{was}; DeepSpeed ignores dotted "
                            "keys, dslaunch applies them as TRL means them")
    return out


_ABSENT = object()
