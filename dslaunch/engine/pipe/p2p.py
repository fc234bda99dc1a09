"""Point-to-point transfer of activations and gradients between neighbouring stages.

Each message is a tensor or a tuple of tensors. Sends are non-blocking (``isend``; the tensors
are kept alive until ``wait_all``), receives block. Shapes travel once: every send is preceded by
a small fixed-size int64 header; its first word says whether the layout (count, dtypes, shapes)
is the same as on the last message of that channel (then nothing else is in it) or new (then the
header carries it). So a fixed-shape pipeline exchanges shapes once, and tensors whose shape
varies between micro-batches or batches (another sequence length, a smaller last micro-batch)
are still received into buffers of the right size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]
_CODE = {d: i for i, d in enumerate(DTYPES)}
MAX_TENSORS, MAX_DIMS = 8, 8
_SLOT = 2 + MAX_DIMS  # dtype, ndim, dims
HEADER_LEN = 3 + MAX_TENSORS * _SLOT  # changed, is_tuple, count, slots


def _layout(tensors: tuple, is_tuple: bool) -> tuple:
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"pipeline p2p: {len(tensors)} tensors in one message; at most "
                         f"{MAX_TENSORS}")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"pipeline p2p: stages exchange tensors only, got {type(t).__name__}")
        if t.dim() > MAX_DIMS or t.dtype not in _CODE:
            raise ValueError(f"pipeline p2p: cannot send a {t.dtype} tensor of shape "
                             f"{tuple(t.shape)}")
    return (is_tuple, tuple((_CODE[t.dtype], tuple(t.shape)) for t in tensors))


def _encode(layout) -> torch.Tensor:
    is_tuple, items = layout
    h = torch.zeros(HEADER_LEN, dtype=torch.int64)
    h[0], h[1], h[2] = 1, int(is_tuple), len(items)
    for i, (code, shape) in enumerate(items):
        base = 3 + i * _SLOT
        h[base], h[base + 1] = code, len(shape)
        for j, d in enumerate(shape):
            h[base + 2 + j] = d
    return h


def _decode(h: torch.Tensor):
    vals = h.tolist()
    items = []
    for i in range(vals[2]):
        base = 3 + i * _SLOT
        ndim = vals[base + 1]
        items.append((vals[base], tuple(vals[base + 2:base + 2 + ndim])))
    return (bool(vals[1]), tuple(items))


class P2P:
    """The channels of one rank to its pipeline neighbours (global ranks)."""

    def __init__(self, device=None):
        self.device = device or torch.device("cpu")
        self._sent_layout: dict = {}
        self._recv_layout: dict = {}
        self._pending: list = []
        self.stats = {"messages": 0, "headers_with_shapes": 0, "bytes": 0}

    def send(self, obj, dst: int, kind: str) -> None:
        is_tuple = isinstance(obj, (tuple, list))
        tensors = tuple(obj) if is_tuple else (obj,)
        tensors = tuple(t.detach().contiguous() for t in tensors)
        layout = _layout(tensors, is_tuple)
        key = (dst, kind)
        if self._sent_layout.get(key) == layout:
            header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        else:
            header = _encode(layout)
            self._sent_layout[key] = layout
            self.stats["headers_with_shapes"] += 1
        self._isend(header, dst)
        for t in tensors:
            self._isend(t, dst)
        self.stats["messages"] += 1

    def _isend(self, t, dst):
        self._pending.append((dist.isend(t, dst=dst), t))
        self.stats["bytes"] += t.numel() * t.element_size()

    def recv(self, src: int, kind: str):
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        dist.recv(header, src=src)
        key = (src, kind)
        if header[0].item() == 1:
            self._recv_layout[key] = _decode(header)
        if key not in self._recv_layout:
            raise RuntimeError(f"pipeline p2p: first message from rank {src} ({kind}) carried "
                               "no shapes")
        is_tuple, items = self._recv_layout[key]
        out = []
        for code, shape in items:
            t = torch.empty(shape, dtype=DTYPES[code])
            dist.recv(t, src=src)
            out.append(t.to(self.device) if self.device.type != "cpu" else t)
        return tuple(out) if is_tuple else out[0]

    def wait_all(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
