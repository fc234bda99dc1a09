"""``dslaunch.runtime.sequence_parallel.ulysses_sp``, as
``deepspeed.runtime.sequence_parallel.ulysses_sp``: the names Transformers, Accelerate and
Axolotl import for Ulysses sequence parallelism (Arctic Long Sequence Training).

A face: the implementations are ``dslaunch/engine/parallel/sequence/hf.py`` (``UlyssesSPAttentionHF``)
``dslaunch/engine/parallel/sequence/sharding.py`` (``UlyssesSPDataLoaderAdapter``) and
``dslaunch/engine/parallel/sequence/tiled.py`` (``TiledMLP``, ``TiledFusedLogitsLoss``).
"""

from dslaunch.engine.parallel.sequence.hf import UlyssesSPAttentionHF  # noqa: F401
from dslaunch.engine.parallel.sequence.sharding import UlyssesSPDataLoaderAdapter  # noqa: F401
from dslaunch.engine.parallel.sequence.tiled import TiledFusedLogitsLoss, TiledMLP  # noqa: F401


def __getattr__(name):  # a DeepSpeed name we do not provide (yet): say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
