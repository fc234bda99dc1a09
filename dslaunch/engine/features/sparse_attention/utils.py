"""``SparseAttentionUtils``: DeepSpeed's helpers for putting sparse attention into a pretrained
BERT / RoBERTa (Hugging Face layout: ``model.bert`` / ``model.roberta``, ``encoder.layer[i]
.attention.self``): longer position embeddings, swapping the self-attention layers, padding
inputs to a multiple of the block and removing the padding afterwards.

Difference from DeepSpeed 0.18: ``replace_model_self_attention_with_sparse_self_attention``
calls this class's layer replacement (DeepSpeed calls it as a method of the model, which a
Hugging Face model does not have).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dslaunch.engine.base.log import logger
from dslaunch.engine.features.sparse_attention.modules import (
    DEFAULT_SPARSITY_CONFIG,
    BertSparseSelfAttention,
)


class SparseAttentionUtils:

    @staticmethod
    def extend_position_embedding(model, max_position):
        """Tile the position embeddings of ``model.bert`` / ``model.roberta`` up to
        ``max_position`` (RoBERTa's first two rows, its padding offset, stay in front)."""
        if hasattr(model, "bert"):
            weight = model.bert.embeddings.position_embeddings.weight
            original = weight.size(0)
            assert max_position > original
            multiples = max(1, max_position // original)
            model.bert.embeddings.position_embeddings.weight.data = weight.repeat(multiples, 1)
        elif hasattr(model, "roberta"):
            weight = model.roberta.embeddings.position_embeddings.weight
            original, width = weight.shape
            original -= 2
            multiples = max(1, max_position // original)
            assert max_position > original
            max_position += 2
            extended = weight.new_empty(max_position, width)
            at = 2
            for _ in range(multiples):
                extended[at:at + original] = weight[2:]
                at += original
            model.roberta.embeddings.position_embeddings.weight.data = extended
        else:
            raise ValueError("extend_position_embedding knows 'bert' and 'roberta' models only")
        model.config.max_position_embeddings = max_position
        logger.info(f"Extended position embeddings to {original * multiples}")
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer, max_position):
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        logger.info(f"updated tokenizer model max length to {max_position}")
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(
            model, max_position, sparsity_config=DEFAULT_SPARSITY_CONFIG):
        if hasattr(model, "bert"):
            model.config.max_position_embeddings = max_position
            layers = model.bert.encoder.layer
        elif hasattr(model, "roberta"):
            model.config.max_position_embeddings = max_position + 2
            layers = model.roberta.encoder.layer
        else:
            raise ValueError("replace_model_self_attention_with_sparse_self_attention knows "
                             "'bert' and 'roberta' models only")
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
            model.config, layers, sparsity_config)
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(
            config, layers, sparsity_config=DEFAULT_SPARSITY_CONFIG):
        """Each layer's ``attention.self`` becomes a BertSparseSelfAttention that keeps the
        layer's query/key/value linears."""
        for layer in layers:
            sparse = BertSparseSelfAttention(config, sparsity_config)
            sparse.query = layer.attention.self.query
            sparse.key = layer.attention.self.key
            sparse.value = layer.attention.self.value
            layer.attention.self = sparse
        return layers

    @staticmethod
    def pad_to_block_size(block_size, input_ids, attention_mask, token_type_ids, position_ids,
                          inputs_embeds, pad_token_id, model_embeddings):
        """Pad the sequence dimension to a multiple of ``block_size``; returns ``(pad_len,
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)``."""
        batch_size, seq_len = (input_ids.shape if input_ids is not None
                               else inputs_embeds.shape[:-1])
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len > 0:
            if inputs_embeds is not None:
                pad_ids = inputs_embeds.new_full((batch_size, pad_len), pad_token_id,
                                                 dtype=torch.long)
                inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
            if input_ids is not None:
                input_ids = F.pad(input_ids, (0, pad_len), value=pad_token_id)
            if position_ids is not None:
                position_ids = F.pad(position_ids, (0, pad_len), value=pad_token_id)
            attention_mask = F.pad(attention_mask, (0, pad_len), value=False)
            token_type_ids = F.pad(token_type_ids, (0, pad_len), value=0)
        return pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

    @staticmethod
    def unpad_sequence_output(pad_len, sequence_output):
        if pad_len > 0:
            sequence_output = sequence_output[:, :-pad_len]
        return sequence_output
