"""AutoTP's LM head. By default (``tensor_parallel.vocab_parallel_lm_head: false``, DeepSpeed
0.19.8's training default) the untied ``lm_head`` of a Hugging Face causal LM is split by
vocabulary rows and its logits all-gathered (``gather_lm_head``): each rank computes half the
head's matmuls (forward and backward) and holds half its weight, gradient and optimizer state,
and the model's own loss runs on the whole logits. With ``vocab_parallel_lm_head: true``
(``split_lm_head``) the logits stay split and the loss is computed on them.

Each rank computes the logits of its vocabulary range only (1/N of the head's matmul and of the
softmax work, and of the logits' memory) and ``vocab_parallel_cross_entropy`` combines the ranks'
max, sum of exponentials and target logit, so the loss equals the whole head's. The model's
``loss_function`` (Transformers calls it with the logits, the labels and, under the Trainer,
``num_items_in_batch``) is replaced by one that shifts the labels as ``ForCausalLMLoss`` does.
The logits a forward returns are this rank's vocabulary range.

The vocabulary rows are cut as DeepSpeed cuts them (``autotp_shards.grain_sizes``): near even in
``tp_grain_size`` grains, the first ranks one more when the size does not divide the vocabulary;
the gathered logits are put back in order from the uneven slices.

A tied head (its weight the input embedding's) stays whole: splitting it would split the
embedding too.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dslaunch.engine.parallel.tensor_parallel import (
    ColumnParallelLinear,
    group_rank,
    group_world,
    vocab_parallel_cross_entropy,
)

HEAD_NAMES = ("lm_head", "embed_out")  # Llama-style / GPT-NeoX's


def _head(model: nn.Module):
    for name in HEAD_NAMES:
        m = getattr(model, name, None)
        if isinstance(m, nn.Linear):
            return name, m
    return None, None


def _tied(model: nn.Module, head: nn.Linear) -> bool:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb is not None and getattr(emb, "weight", None) is head.weight


def _refuse(why: str):
    raise ValueError(f"tensor_parallel.vocab_parallel_lm_head: {why}; set it false (the head "
                     "then stays whole on every rank)")


class VocabParallelCausalLMLoss:
    """``ForCausalLMLoss`` over logits split by vocabulary: this rank's range starts at
    ``vocab_start``."""

    def __init__(self, group, vocab_start: int):
        self.group, self.vocab_start = group, vocab_start

    def __call__(self, logits, labels, vocab_size=None, num_items_in_batch=None,
                 ignore_index: int = -100, shift_labels=None, **_):
        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        target = shift_labels.reshape(-1).to(logits.device)
        flat = logits.reshape(-1, logits.shape[-1])
        keep = target != ignore_index
        per_token = vocab_parallel_cross_entropy(flat, target.masked_fill(~keep, 0), self.group,
                                                 self.vocab_start)
        total = (per_token * keep).sum()
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(total.device)
            return total / num_items_in_batch
        return total / keep.sum()


def _vocab_rows(head: nn.Linear, group, grain: int):
    """This rank's vocabulary rows and every rank's count: DeepSpeed's cut of an LM head, near
    even in grains (``autotp_shards.py``; by grains, never by heads)."""
    from dslaunch.engine.parallel.autotp_shards import ShardRule

    rule, w = ShardRule(kv=None, grain=grain or 1), group_world(group)
    start, stop = rule.span("lm_head", head.out_features, w, group_rank(group))
    return torch.arange(start, stop, device="cpu"), rule.sizes("lm_head", head.out_features, w)


def gather_lm_head(model: nn.Module, group, grain: int = 1) -> bool:
    """Split ``model``'s untied LM head by vocabulary, its output gathered (the logits whole on
    every rank, equal to the unsplit head's); True when done. A head that is tied or missing
    stays whole (False)."""
    name, head = _head(model)
    if head is None or _tied(model, head):
        return False
    from dslaunch.engine.parallel.autotp_layers import keep_params

    rows, sizes = _vocab_rows(head, group, grain)
    setattr(model, name, keep_params(ColumnParallelLinear.from_linear(
        head, group, gather_output=True, rows=rows, gather_sizes=sizes), head, head))
    return True


def split_lm_head(model: nn.Module, group, grain: int = 1) -> bool:
    """Split ``model``'s LM head by vocabulary and give it the matching loss; True when done.
    Refuses (naming the key) a model whose head cannot be split."""
    name, head = _head(model)
    if head is None:
        _refuse(f"{type(model).__name__} has no nn.Linear named {' or '.join(HEAD_NAMES)}")
    if _tied(model, head):
        _refuse("the LM head is tied to the input embedding (tie_word_embeddings)")
    if not hasattr(type(model), "loss_function"):
        _refuse(f"{type(model).__name__} computes no Hugging Face loss_function to replace")
    from dslaunch.engine.parallel.autotp_layers import keep_params  # the head keeps its own Parameter objects

    rows, _ = _vocab_rows(head, group, grain)
    split = keep_params(ColumnParallelLinear.from_linear(head, group, rows=rows), head, head)
    setattr(model, name, split)
    start = split.weight.tp_ranges[0][0]
    model.loss_function = VocabParallelCausalLMLoss(group, start)
    return True
