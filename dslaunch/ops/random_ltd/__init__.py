"""``dslaunch.ops.random_ltd``, as ``deepspeed.ops.random_ltd``: sampling, gathering and
scattering the tokens random-LTD keeps, in torch ops on any device (DeepSpeed's use its CUDA
``RandomLTDBuilder`` op). A face: the implementation is ``dslaunch/engine/features/random_ltd/tokens.py``.
"""

from dslaunch.ops.random_ltd.dropping_utils import (
    GatherTokens,
    ScatterTokens,
    bert_sample_tokens,
    gpt_sample_tokens,
)

__all__ = ["gpt_sample_tokens", "bert_sample_tokens", "GatherTokens", "ScatterTokens"]
