"""Ulysses for Hugging Face Transformers models: DeepSpeed's ``UlyssesSPAttentionHF`` and its
``register_with_transformers`` (what Accelerate's and Axolotl's sequence-parallel paths call).

``register_with_transformers`` builds the sequence x data grid (``topology.build_grid``),
replaces the model's attention function in ``transformers``' ``ALL_ATTENTION_FUNCTIONS`` (under
the name the model uses, so every other code path keyed on that name still runs) with a wrapper
that exchanges q, k, v from sequence shards to head shards, calls the original function on the
whole sequence, and exchanges the result back; it returns the grid, to be passed to
``initialize(mpu=...)``. Attention masks are dropped (causal attention over the gathered
sequence; the position ids, gathered too, carry the positions), as DeepSpeed does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dslaunch.engine.parallel.sequence.ulysses import UlyssesAllToAll

# HF attention functions take q, k, v as [batch, heads, seq, head_dim] and return [batch, seq,
# heads, head_dim]
_HF_HEADS, _HF_SEQ = 1, 2
_OUT_SEQ, _OUT_HEADS = 1, 2


class UlyssesSPAttentionHF(torch.nn.Module):
    """DeepSpeed's signature. ``attn``: a Transformers attention function ``(module, q, k, v,
    attention_mask, *args, **kwargs) -> (output, weights)``. Key/value heads fewer than the
    group size are replicated (``kv_head_count`` must divide the group size or be divisible by
    it); query heads must be divisible by it."""

    def __init__(self, attn, batch_size: int, attn_head_count: int, attn_head_size: int,
                 kv_head_count: int, num_hidden_layers: int, process_group,
                 seq_length_is_variable: bool = False, local_seq_length: int | None = None,
                 global_seq_length: int | None = None, disable_in_eval: bool = False):
        super().__init__()
        self.attn = attn
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.sp_rank = dist.get_rank(process_group)
        self.batch_size = batch_size
        self.attn_head_count, self.attn_head_size = attn_head_count, attn_head_size
        self.global_kv_head_count = kv_head_count
        self.num_hidden_layers = num_hidden_layers
        self.seq_length_is_variable = seq_length_is_variable
        self.local_seq_length, self.global_seq_length = local_seq_length, global_seq_length
        self.disable_in_eval = disable_in_eval
        self.core_attn_implementation = None  # set by register_with_transformers
        if attn_head_count % self.world_size:
            raise ValueError(f"Attention head count {attn_head_count} is not divisible by SP size "
                             f"{self.world_size}")
        if kv_head_count % self.world_size and self.world_size % kv_head_count:
            raise ValueError(f"KV attention head count {kv_head_count} is not divisible by SP size "
                             f"{self.world_size} or vice versa")
        # fewer key/value heads than ranks: each rank gets a copy of the one its queries use
        self.kv_replication_factor = max(1, self.world_size // kv_head_count)

    def _to_heads(self, t: torch.Tensor) -> torch.Tensor:
        return UlyssesAllToAll.apply(t, _HF_HEADS, _HF_SEQ, self.process_group)

    def forward(self, module, query, key, value, attention_mask, *args: Any, **kwargs: Any):
        if self.disable_in_eval and not module.training:
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        if "position_ids" not in kwargs:
            raise ValueError("Ulysses SP needs position_ids in every forward() (each token's "
                             "global position; UlyssesSPDataLoaderAdapter keeps them)")
        local = query.shape[_HF_SEQ]
        if not self.seq_length_is_variable and self.local_seq_length not in (None, local):
            raise ValueError(f"Ulysses SP: the local sequence is {local} tokens, registered as "
                             f"{self.local_seq_length} (seq_length_is_variable=False)")
        parts = [torch.empty_like(kwargs["position_ids"]) for _ in range(self.world_size)]
        dist.all_gather(parts, kwargs["position_ids"].contiguous(), group=self.process_group)
        kwargs["position_ids"] = torch.cat(parts, dim=1)

        if self.kv_replication_factor > 1:
            key = key.repeat_interleave(self.kv_replication_factor, dim=_HF_HEADS)
            value = value.repeat_interleave(self.kv_replication_factor, dim=_HF_HEADS)
        q, k, v = self._to_heads(query), self._to_heads(key), self._to_heads(value)
        if self.kv_replication_factor > 1:  # the module's grouping after the replication
            module.num_key_value_groups = q.shape[_HF_HEADS] // k.shape[_HF_HEADS]
        context, weights = self.attn(module, q, k, v, attention_mask, *args, **kwargs)
        # [b, S, h/P, d] -> [b, S/P, h, d] -> [b, S/P, h * d]
        out = UlyssesAllToAll.apply(context.contiguous(), _OUT_SEQ, _OUT_HEADS, self.process_group)
        return out.reshape(*out.shape[:2], -1), weights

    @classmethod
    def register_with_transformers(cls, model_name_or_path, core_attn_implementation,
                                   sequence_parallel_size, micro_batch_size, seq_length=None,
                                   seq_length_is_variable=True, disable_in_eval=False,
                                   max_length=None):
        """Register Ulysses over ``core_attn_implementation`` and return the mpu (the grid);
        None when ``sequence_parallel_size`` is 1. ``model_name_or_path``: a loaded model (its
        ``config``) or a name/path for ``AutoConfig``. ``max_length``: DeepSpeed's deprecated
        spelling of ``seq_length``."""
        if sequence_parallel_size == 1:
            return None
        if seq_length is None:
            seq_length = max_length
        if not seq_length_is_variable and seq_length is None:
            raise ValueError("Either `seq_length_is_variable` needs to be `True` or `seq_length` "
                             "needs to be set to the fixed sequence length")
        from transformers import AutoConfig
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        from dslaunch.engine.parallel.topology import build_grid

        loaded = hasattr(model_name_or_path, "config")
        hf_config = model_name_or_path.config if loaded else \
            AutoConfig.from_pretrained(model_name_or_path)
        if loaded:
            have = getattr(hf_config, "_attn_implementation", None)
            if have is not None and have != core_attn_implementation:
                raise ValueError(f"core_attn_implementation='{core_attn_implementation}' does not "
                                 f"match the model's attn_implementation='{have}'")
        if core_attn_implementation in ("eager", "paged|eager"):
            raise ValueError(f"{core_attn_implementation} attn_implementation isn't supported by "
                             "Ulysses sequence parallelism (it needs a 4D attention mask); use "
                             "'sdpa', 'flex_attention' or a flash attention variant")
        if core_attn_implementation not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(f"{core_attn_implementation} is not a valid attn_implementation; the "
                             f"choices are {ALL_ATTENTION_FUNCTIONS.valid_keys()}")
        grid = build_grid(sequence=sequence_parallel_size)
        arch = hf_config.get_text_config()
        local = None if seq_length_is_variable else seq_length // sequence_parallel_size
        uattn = cls(attn=ALL_ATTENTION_FUNCTIONS[core_attn_implementation],
                    batch_size=micro_batch_size, attn_head_count=arch.num_attention_heads,
                    attn_head_size=getattr(arch, "head_dim", None)
                    or arch.hidden_size // arch.num_attention_heads,
                    kv_head_count=arch.num_key_value_heads,
                    num_hidden_layers=arch.num_hidden_layers,
                    process_group=grid.get_sequence_parallel_group(),
                    seq_length_is_variable=seq_length_is_variable, local_seq_length=local,
                    global_seq_length=None if seq_length_is_variable else seq_length,
                    disable_in_eval=disable_in_eval)
        uattn.core_attn_implementation = core_attn_implementation

        def uattn_wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            # the mask was built for the local shard; causal attention over the gathered
            # sequence needs none (flex attention's BlockMask is not rebuilt here: dropped too)
            return uattn(module, query, key, value, None, *args, **kwargs)

        ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = uattn_wrapper
        return grid
