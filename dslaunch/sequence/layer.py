"""``dslaunch.sequence.layer``, as ``deepspeed.sequence.layer``: Ulysses ``DistributedAttention``.

A face: the implementation is ``dslaunch/engine/sequence/ulysses.py``.
"""

from dslaunch.engine.sequence.ulysses import DistributedAttention, seq_all_to_all  # noqa: F401
