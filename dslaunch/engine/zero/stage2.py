"""ZeRO stage 2 (see stage12.py, shared with stage 1)."""

from .stage12 import Stage2Strategy

__all__ = ["Stage2Strategy"]
