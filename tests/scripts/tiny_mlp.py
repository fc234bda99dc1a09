"""A tiny model and its data, shared by tests/scripts/config_features.py (the ranks) and
tests/test_config_features.py (the single-process torch references): same weights from the same
seed, and every micro-batch a pure function of (step, micro-step, rank)."""

import torch

IN, HIDDEN, OUT, MICRO = 8, 16, 4, 2


class TinyMLP(torch.nn.Module):
    """Linear layers (autocast's lower-precision-safe modules) around a LayerNorm (not one)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, OUT)
        self.seen_dtypes = []  # fc1's output dtype at each forward (autocast check)

    def forward(self, x, y):
        h = self.fc1(x)
        self.seen_dtypes.append(str(h.dtype))
        out = self.fc2(torch.nn.functional.gelu(self.norm(h)))
        return torch.nn.functional.mse_loss(out.float(), y.float())


def model(seed: int = 0) -> TinyMLP:
    torch.manual_seed(seed)
    return TinyMLP()


def batch(step: int, micro: int, rank: int):
    """(x, y) of one micro-batch; every rank sees different data."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g)
