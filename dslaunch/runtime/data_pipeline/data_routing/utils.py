"""``deepspeed.runtime.data_pipeline.data_routing.utils``: DeepSpeed's per-sample gather and
scatter of kept tokens for ``[batch, seq, hidden]`` decoder states, in torch ops."""

from __future__ import annotations

import torch


def bsh_decoder_gather(reserved_length: int, hidden_states: torch.Tensor, mask: torch.Tensor):
    """``(kept states [batch, kept, h], kept positions per sample, the causal mask cut to kept x
    kept)``: each sample keeps ``reserved_length`` random positions, in order."""
    positions = [torch.randperm(hidden_states.size(1), device=hidden_states.device)
                 [:reserved_length].sort().values for _ in range(hidden_states.size(0))]
    kept = torch.stack([hidden_states[b, p] for b, p in enumerate(positions)])
    return kept, positions, mask[:, :, :reserved_length, :reserved_length]


def bsh_decoder_scatter(hidden_states: torch.Tensor, part_hidden_states: torch.Tensor,
                        rand_list) -> torch.Tensor:
    """Writes each sample's kept states back at its positions (in place, as DeepSpeed's)."""
    for b, positions in enumerate(rand_list):
        hidden_states[b, positions, :] = part_hidden_states[b]
    return hidden_states
