"""Small checks shared by the config sections that validate their own keys (data efficiency,
random-LTD): each returns a verdict or problem strings, never raises."""

from __future__ import annotations


def is_int(value, lo=None) -> bool:
    """An int (not a bool, which is one in Python) at least ``lo`` when given."""
    return isinstance(value, int) and not isinstance(value, bool) and (lo is None or value >= lo)


def unknown_keys(section: dict, known: set, prefix: str) -> list:
    """One problem per key of ``section`` not in ``known``, naming the known ones."""
    return [f"{prefix}.{k}: unknown key; known: {', '.join(sorted(known))}"
            for k in section if k not in known]
