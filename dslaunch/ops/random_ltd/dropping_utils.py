"""``deepspeed.ops.random_ltd.dropping_utils`` (``dslaunch/engine/features/random_ltd/tokens.py``)."""

from dslaunch.engine.features.random_ltd.tokens import (
    GatherTokens,
    ScatterTokens,
    bert_sample_tokens,
    gpt_sample_tokens,
)

__all__ = ["gpt_sample_tokens", "bert_sample_tokens", "GatherTokens", "ScatterTokens"]
