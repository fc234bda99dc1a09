"""``dslaunch.sequence.layer``, as ``deepspeed.sequence.layer``: Ulysses ``DistributedAttention``.

A face: the implementation is ``dslaunch/engine/parallel/sequence/ulysses.py``.
"""

from dslaunch.engine.parallel.sequence.ulysses import DistributedAttention, seq_all_to_all  # noqa: F401
