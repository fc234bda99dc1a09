"""``dslaunch.inject``: the rank side of ``dslaunch run --inject`` for a script that does not use
the engine (a plain torch loop): call ``tick(step)`` once per training step. The engine calls it
itself. Without ``--inject`` it does nothing."""

from dslaunch.engine.base.fault_injection import tick

__all__ = ["tick"]
