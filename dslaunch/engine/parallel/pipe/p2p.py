"""Point-to-point transfer of activations and gradients between neighbouring stages.

Each message is a tensor or a tuple of tensors. Sends are non-blocking (``isend``; buffers are
kept alive until ``wait_all``), receives block.

One transport send per message in the steady state: the tensors are packed into one byte buffer
whose last 8 bytes are a flag word, and shapes travel only when they change. Per channel (peer,
kind) both sides remember the layout (count, dtypes, shapes) of the last message, so the receiver
knows how many bytes to expect:

- first message of a channel: a shape header (a small fixed-size int64 tensor), then the packed
  message;
- same layout as last time: the packed message only, flag 0;
- new layout (another sequence length, a smaller last micro-batch): a buffer of the *old* size
  with flag 1 (what the receiver has posted; its contents are ignored), the header with the new
  layout, then the packed message.

So a fixed-shape pipeline exchanges shapes once, and tensors whose shape varies between
micro-batches or batches are still received into buffers of the right size. Each gloo message
costs a round of thread wake-ups on both sides, so not sending a header per message matters.

Receives can be posted ahead (``prefetch``, or ``recv(..., prefetch_next=True)``): gloo moves a
message only once its receive is posted, so a receive posted while this stage still computes
lets the bytes arrive in the background instead of on the critical path. Only post one that the
peer is certain to send (the executor counts the receives left in its instruction stream): a
receive left pending at shutdown would hang.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]
_CODE = {d: i for i, d in enumerate(DTYPES)}
MAX_TENSORS, MAX_DIMS = 8, 8
_SLOT = 2 + MAX_DIMS  # dtype, ndim, dims
HEADER_LEN = 2 + MAX_TENSORS * _SLOT  # is_tuple, count, slots
_ALIGN = 64  # each tensor starts on a cache line of the packed buffer (aligned views)
_FLAG_BYTES = 8
SAME, CHANGED = 0, 1  # the flag word at the end of a packed buffer


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
    h[0], h[1] = int(is_tuple), len(items)
    for i, (code, shape) in enumerate(items):
        base = 2 + i * _SLOT
        h[base], h[base + 1] = code, len(shape)
        for j, d in enumerate(shape):
            h[base + 2 + j] = d
    return h


def _decode(h: torch.Tensor):
    vals = h.tolist()
    items = []
    for i in range(vals[1]):
        base = 2 + i * _SLOT
        ndim = vals[base + 1]
        items.append((vals[base], tuple(vals[base + 2:base + 2 + ndim])))
    return (bool(vals[0]), tuple(items))


def _offsets(layout) -> tuple:
    """Byte offset of each tensor in the packed buffer, and the buffer's size (flag included)."""
    offsets, pos = [], 0
    for code, shape in layout[1]:
        offsets.append(pos)
        n = DTYPES[code].itemsize
        for d in shape:
            n *= d
        pos += -(-n // _ALIGN) * _ALIGN
    return offsets, pos + _FLAG_BYTES


def _flag(buf: torch.Tensor) -> torch.Tensor:
    return buf[-_FLAG_BYTES:].view(torch.int64)


def _tag(kind: str) -> int:
    """One gloo tag per channel kind, so that receives posted ahead on two channels from the same
    peer cannot take each other's messages."""
    return zlib.crc32(kind.encode()) & 0xFFFF


def _views(buf: torch.Tensor, layout, offsets) -> list:
    out = []
    for (code, shape), off in zip(layout[1], offsets):
        dtype = DTYPES[code]
        n = dtype.itemsize
        for d in shape:
            n *= d
        out.append(buf[off:off + n].view(dtype).view(shape))
    return out


class P2P:
    """The channels of one rank to its pipeline neighbours (global ranks)."""

    def __init__(self, device=None):
        self.device = device or torch.device("cpu")
        self._sent_layout: dict = {}  # (dst, kind) -> layout the receiver expects next
        self._recv_layout: dict = {}  # (src, kind) -> (layout, offsets, size)
        self._posted: dict = {}  # (src, kind) -> (work, buffer, (layout, offsets, size))
        self._pending: list = []
        # messages: tensors or tuples sent; transfers: transport-level sends (headers and
        # discarded stale-size buffers included); headers_with_shapes: layouts sent
        self.stats = {"messages": 0, "transfers": 0, "headers_with_shapes": 0, "bytes": 0}

    def send(self, obj, dst: int, kind: str) -> None:
        is_tuple = isinstance(obj, (tuple, list))
        tensors = tuple(obj) if is_tuple else (obj,)
        layout = _layout(tensors, is_tuple)
        key, tag = (dst, kind), _tag(kind)
        expected = self._sent_layout.get(key)
        if expected != layout:
            if expected is not None:  # the receiver waits for a buffer of the old size
                stale = torch.zeros(_offsets(expected)[1], dtype=torch.uint8)
                _flag(stale).fill_(CHANGED)
                self._isend(stale, dst, tag)
            self._isend(_encode(layout), dst, tag)
            self._sent_layout[key] = layout
            self.stats["headers_with_shapes"] += 1
        offsets, size = _offsets(layout)
        buf = torch.empty(size, dtype=torch.uint8)
        for view, t in zip(_views(buf, layout, offsets), tensors):
            view.copy_(t.detach())
        _flag(buf).fill_(SAME)
        self._isend(buf, dst, tag)
        self.stats["messages"] += 1

    def _isend(self, t, dst, tag):
        self._pending.append((dist.isend(t, dst=dst, tag=tag), t))
        self.stats["transfers"] += 1
        self.stats["bytes"] += t.numel() * t.element_size()

    def prefetch(self, src: int, kind: str) -> None:
        """Post the receive of the next message from ``src`` now (layout known: the last one
        seen; a changed layout is caught by the flag). Without a known layout (first message of
        the channel) nothing is posted and ``recv`` reads the header first."""
        key = (src, kind)
        if key in self._posted or key not in self._recv_layout:
            return
        entry = self._recv_layout[key]
        buf = torch.empty(entry[2], dtype=torch.uint8)
        self._posted[key] = (dist.irecv(buf, src=src, tag=_tag(kind)), buf, entry)

    def recv(self, src: int, kind: str, prefetch_next: bool = False):
        """The next message from ``src`` (blocks until it is here); with ``prefetch_next`` the
        receive of the message after it is posted before returning."""
        key, tag = (src, kind), _tag(kind)
        if key in self._posted:
            work, buf, entry = self._posted.pop(key)
            work.wait()
        else:
            if key not in self._recv_layout:
                self._recv_header(key, src, tag)
            entry = self._recv_layout[key]
            buf = torch.empty(entry[2], dtype=torch.uint8)
            dist.recv(buf, src=src, tag=tag)
        if int(_flag(buf)) == CHANGED:
            self._recv_header(key, src, tag)
            entry = self._recv_layout[key]
            buf = torch.empty(entry[2], dtype=torch.uint8)
            dist.recv(buf, src=src, tag=tag)
        if prefetch_next:
            self.prefetch(src, kind)
        layout, offsets, _ = entry
        out = _views(buf, layout, offsets)
        if self.device.type != "cpu":
            out = [t.to(self.device) for t in out]
        return tuple(out) if layout[0] else out[0]

    def _recv_header(self, key, src, tag) -> None:
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        dist.recv(header, src=src, tag=tag)
        layout = _decode(header)
        self._recv_layout[key] = (layout,) + _offsets(layout)

    def wait_all(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
