"""ZeRO stage 1 (see stage12.py, shared with stage 2)."""

from .stage12 import Stage1Strategy

__all__ = ["Stage1Strategy"]
