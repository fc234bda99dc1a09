"""Config features that are parsed and validated but not implemented yet.

Each row: the key path reported, what the feature is, which issue brings it, and a predicate on
the resolved values that says whether the config uses it. A section that is present but disabled
is fine. When you implement a feature, delete its row (and add a config to configs/ using it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .compression import unimplemented as compression_unimplemented


@dataclass(frozen=True)
class Feature:
    path: str
    what: str
    issue: str  # "issue N", or "" when no issue plans it
    used: Callable[[Callable[[str], object]], bool]  # takes get("dotted.path") -> value


def _enabled(section: str) -> Callable:
    return lambda get: bool(get(section + ".enabled"))


def _section(get: Callable, top: str, *keys: str) -> dict:
    """The nested dict ``top.keys...`` of an open section ({} where absent)."""
    section = get(top) or {}
    for key in keys:
        section = section.get(key) or {} if isinstance(section, dict) else {}
    return section if isinstance(section, dict) else {}


# the pointer of the refusals that are not planned: what to do instead
REFUSED = "see docs/porting.md, 'Config sections dslaunch refuses'"

NOT_SUPPORTED_YET = [
    Feature("amp.enabled", f"NVIDIA apex AMP: use bf16 or fp16 instead; {REFUSED}", "",
            _enabled("amp")),
    Feature("hybrid_engine.enabled", "the hybrid (RLHF) engine: generate with the model "
            f"itself or an inference server; {REFUSED}", "", _enabled("hybrid_engine")),
    Feature("nebula.enabled", "Nebula checkpointing: use checkpoint.async_save and "
            f"checkpoint.keep_last; {REFUSED}", "", _enabled("nebula")),
    Feature("compile.deepcompile", f"DeepCompile: drop the key, ZeRO runs eagerly; {REFUSED}",
            "", lambda get: bool(get("compile.deepcompile"))),
]


def unsupported_problems(get: Callable[[str], object]) -> list:
    """One "<path>: not supported yet (...)" line per feature the config uses."""
    # compression_training: the methods dslaunch applies pass; the others are named (compression.py)
    problems = list(compression_unimplemented(get("compression_training")))
    for feature in NOT_SUPPORTED_YET:
        if feature.used(get):
            when = f"comes with {feature.issue}" if feature.issue else "not planned yet"
            problems.append(f"{feature.path}: not supported yet ({feature.what}; {when})")
    return problems
