"""``dslaunch.ops.sparse_attention``, as ``deepspeed.ops.sparse_attention`` (DeepSpeed 0.18;
0.19 removed it): the layouts (``SparsityConfig``, ``DenseSparsityConfig``,
``FixedSparsityConfig``, ``VariableSparsityConfig``, ``BigBirdSparsityConfig``,
``BSLongformerSparsityConfig``, ``LocalSlidingWindowSparsityConfig``; ``make_layout`` as
DeepSpeed's), ``SparseSelfAttention``, ``BertSparseSelfAttention`` and ``SparseAttentionUtils``,
on the CPU without Triton.

A face: the implementation is ``dslaunch/engine/features/sparse_attention/``.
"""

from dslaunch.engine.features.sparse_attention.layouts import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)
from dslaunch.engine.features.sparse_attention.modules import BertSparseSelfAttention, SparseSelfAttention
from dslaunch.engine.features.sparse_attention.utils import SparseAttentionUtils

__all__ = ["SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig",
           "VariableSparsityConfig", "BigBirdSparsityConfig", "BSLongformerSparsityConfig",
           "LocalSlidingWindowSparsityConfig", "SparseSelfAttention", "BertSparseSelfAttention",
           "SparseAttentionUtils"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
