"""``dslaunch.sequence.tiled``: tiled compute for long sequences, ``TiledMLP`` and
``TiledFusedLogitsLoss`` with the call signatures of DeepSpeed 0.19's
``deepspeed.runtime.sequence_parallel.ulysses_sp`` classes of those names.

A face: the implementation is ``dslaunch/engine/parallel/sequence/tiled.py``.
"""

from dslaunch.engine.parallel.sequence.tiled import TiledFusedLogitsLoss, TiledMLP

__all__ = ["TiledMLP", "TiledFusedLogitsLoss"]
