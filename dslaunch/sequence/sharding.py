"""``dslaunch.sequence.sharding``: the sequence axis outside attention (dslaunch's own names):
``shard_sequence``, ``shift_labels``, the loss over sequence shards
(``sequence_parallel_loss``, ``sequence_parallel_cross_entropy``) and DeepSpeed's
``UlyssesSPDataLoaderAdapter``.

A face: the implementation is ``dslaunch/engine/parallel/sequence/sharding.py``.
"""

from dslaunch.engine.parallel.sequence.sharding import (  # noqa: F401
    IGNORE_INDEX,
    UlyssesSPDataLoaderAdapter,
    sequence_parallel_cross_entropy,
    sequence_parallel_loss,
    shard_sequence,
    shift_labels,
)
