"""How AutoTP's built-in rules cut a layer over the tensor-parallel ranks: DeepSpeed 0.19.8's rule
(its ``get_shard_size``), so a model whose heads or MLP width do not divide by the size trains
split as DeepSpeed splits it, and a size that divides gives the plain even blocks.

- Attention layers (q / k / v / o, each part of a fused q/k/v): in whole key/value heads, the
  first ``kv % tp`` ranks one head more; a query or output projection follows its key/value
  heads (``rows * my_kv_heads // kv``), so under grouped-query attention each rank's query
  heads are exactly those that read its key/value heads.
- Everything else the rules split (MLP layers: a name with ``mlp`` or an MLP projection's
  name): near-even in grains of ``tp_grain_size`` features, the first ranks one grain more, the
  last rank the features left over.

Every rank must get at least one key/value head (a rank with none would hold empty attention
layers): ``check_heads`` says so before anything is split.
"""

from __future__ import annotations

from dataclasses import dataclass

# where a Hugging Face config keeps the key/value head count (DeepSpeed's probe order); the
# query-head names last: without grouped-query attention kv == query heads
KV_HEAD_ATTRS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv",
                 "kv_n_heads", "num_attention_heads", "n_heads", "attention_heads")
# a layer named with one of these is cut by grains, not by heads
GRAIN_CUT_MARKS = ("mlp", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")


def kv_heads(model_config) -> int | None:
    if model_config is None:
        return None
    for attr in KV_HEAD_ATTRS:
        value = getattr(model_config, attr, None)
        if isinstance(value, int):
            return value
    return None


def grain_sizes(total: int, tp: int, grain: int) -> list:
    """The grain-aligned shard sizes of a dimension of ``total`` over ``tp`` ranks."""
    if total < grain:
        return [total // tp + (1 if r < total % tp else 0) for r in range(tp)]
    grains, rest = divmod(total, grain)
    sizes = [(grains // tp + (1 if r < grains % tp else 0)) * grain for r in range(tp)]
    sizes[-1] += rest
    return sizes


@dataclass(frozen=True)
class ShardRule:
    kv: int | None  # the model's key/value heads (None: unknown, cut by grains)
    grain: int = 1

    def sizes(self, name: str, total: int, tp: int) -> list:
        """Every rank's share of a split dimension of ``total`` features of layer ``name``."""
        if self.kv and total % self.kv == 0 and not any(m in name for m in GRAIN_CUT_MARKS):
            return [total * (self.kv // tp + (1 if r < self.kv % tp else 0)) // self.kv
                    for r in range(tp)]
        return grain_sizes(total, tp, self.grain)

    def span(self, name: str, total: int, tp: int, rank: int) -> tuple:
        """``(start, stop)``: the features of ``total`` this rank holds (a contiguous block)."""
        sizes = self.sizes(name, total, tp)
        start = sum(sizes[:rank])
        return start, start + sizes[rank]
