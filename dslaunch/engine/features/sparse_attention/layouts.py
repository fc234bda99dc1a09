"""Block-sparsity layouts of DeepSpeed's sparse attention (``deepspeed.ops.sparse_attention``).

A layout is an int64 tensor ``[num_heads, num_blocks, num_blocks]`` of 0/1: entry ``(h, i, j)``
is 1 when, in head ``h``, the queries of block-row ``i`` attend to the keys of block-column ``j``
(a block is ``block`` consecutive tokens). ``make_layout(seq_len)`` of every class here returns
exactly what DeepSpeed 0.18's returns for the same arguments, including the random blocks
(drawn with Python's ``random.sample``, one call per block row in row order, as DeepSpeed draws
them: the same ``random.seed`` gives the same layout). Checked against DeepSpeed 0.18.9's
``make_layout`` by ``tests/test_sparse_attention.py`` (a stored fixture).

Where a layout keeps one pattern for all heads (``different_layout_per_head`` false) the first
head is built and copied to the others.
"""

from __future__ import annotations

import random

import torch

DIRECTIONS = ("unidirectional", "bidirectional")


def _check_direction(attention: str) -> None:
    if attention not in DIRECTIONS:
        raise NotImplementedError(f"attention {attention!r}: only 'unidirectional' and "
                                  "'bidirectional' are supported")


def _check_global_ranges(starts, ends) -> None:
    if ends is None:
        return
    if len(starts) != len(ends):
        raise ValueError(f"global_block_indices has {len(starts)} entries but "
                         f"global_block_end_indices has {len(ends)}: they must pair up")
    for start, end in zip(starts, ends):
        if start >= end:
            raise ValueError(f"global block range [{start}, {end}): the start must be below the end")


def _window(layout, h, first, last, causal):
    """Mark blocks [first, last) x [first, last) of head h (only j <= i when causal)."""
    for row in range(first, last):
        layout[h, row, first:(row + 1 if causal else last)] = 1


def _sliding(layout, h, width, name, bidirectional=True):
    """Each block row i keeps columns within width // 2 of i (to i itself when causal_end)."""
    num_blocks = layout.shape[1]
    if num_blocks < width:
        raise ValueError(f"{name} {width} is more than the {num_blocks} blocks of a row")
    half = width // 2
    for row in range(num_blocks):
        stop = min(row + half + 1, num_blocks) if bidirectional else row + 1
        layout[h, row, max(0, row - half):stop] = 1


def _random_rows(layout, h, count, causal_population=False):
    """``count`` distinct random columns per row; from [0, row] when causal_population."""
    num_blocks = layout.shape[1]
    if num_blocks < count:
        raise ValueError(f"num_random_blocks {count} is more than the {num_blocks} blocks of a row")
    for row in range(num_blocks):
        population = range(0, row + 1) if causal_population else range(0, num_blocks)
        layout[h, row, random.sample(population, count)] = 1


class SparsityConfig:
    """What every layout shares: the head count, the block size in tokens and whether each head
    gets a pattern of its own (else the first head's is used by all)."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False):
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1

    def setup_layout(self, seq_len):
        """An all-zero layout for ``seq_len`` tokens (which must be a multiple of the block)."""
        if seq_len % self.block != 0:
            raise ValueError(f"sequence length {seq_len} is not a multiple of the block size "
                             f"{self.block}")
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        """With one pattern for all heads, copy head 0 to the others."""
        if not self.different_layout_per_head:
            layout[1:self.num_heads] = layout[0]
        return layout

    def make_layout(self, seq_len):
        raise NotImplementedError(f"{type(self).__name__} defines no pattern: use one of "
                                  "DenseSparsityConfig, FixedSparsityConfig, ...")


class DenseSparsityConfig(SparsityConfig):
    """Every block kept (not sparse): the reference point."""

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        layout.fill_(1)
        return layout


class FixedSparsityConfig(SparsityConfig):
    """The "fixed" pattern of Sparse Transformers (Child et al. 2019), as DeepSpeed adapts it:
    local windows of ``num_local_blocks`` blocks, and in each window ``num_global_blocks``
    blocks (from its end backwards; per head a different choice with
    ``num_different_global_patterns``) that every row attends to (and, with
    ``horizontal_global_attention``, that attend to every block)."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4,
                 num_global_blocks=1, attention="bidirectional", horizontal_global_attention=False,
                 num_different_global_patterns=1):
        super().__init__(num_heads, block, different_layout_per_head)
        if num_local_blocks % num_global_blocks != 0:
            raise ValueError(f"num_local_blocks {num_local_blocks} is not a multiple of "
                             f"num_global_blocks {num_global_blocks}")
        _check_direction(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError("horizontal_global_attention needs attention 'bidirectional'")
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise ValueError("num_different_global_patterns > 1 needs different_layout_per_head")
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise ValueError(f"num_different_global_patterns {num_different_global_patterns} is "
                             f"more than num_local_blocks / num_global_blocks = "
                             f"{num_local_blocks // num_global_blocks}")
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        for first in range(0, num_blocks, self.num_local_blocks):
            _window(layout, h, first, min(first + self.num_local_blocks, num_blocks),
                    self.attention == "unidirectional")
        return layout

    def _global_columns(self, h, layout, start, stop):
        first_row = 0 if self.attention == "bidirectional" else start
        layout[h, first_row:, start:stop] = 1
        if self.horizontal_global_attention:
            layout[h, start:stop, :] = 1

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        g = self.num_global_blocks
        offset = self.num_local_blocks - (1 + h % self.num_different_global_patterns) * g
        whole = num_blocks - num_blocks % self.num_local_blocks  # blocks in complete windows
        for start in range(offset, whole, self.num_local_blocks):
            self._global_columns(h, layout, start, start + g)
        if whole < num_blocks:  # the last, shorter window gets its global blocks too
            start = min(whole + offset, num_blocks - g)
            self._global_columns(h, layout, start, start + g)
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class VariableSparsityConfig(SparsityConfig):
    """Fixed's generalisation: ``num_random_blocks`` random blocks per row, local windows of the
    sizes in ``local_window_blocks`` (the last size repeats to the end), and global blocks at
    ``global_block_indices`` (or the ranges up to ``global_block_end_indices``)."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=(4,), global_block_indices=(0,),
                 global_block_end_indices=None, attention="bidirectional",
                 horizontal_global_attention=False):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_direction(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError("horizontal_global_attention needs attention 'bidirectional'")
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = list(local_window_blocks)
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = (None if global_block_end_indices is None
                                         else list(global_block_end_indices))
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention

    def set_random_layout(self, h, layout):
        # drawn from every column, even for 'unidirectional' (as DeepSpeed does)
        _random_rows(layout, h, self.num_random_blocks)
        return layout

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        causal = self.attention == "unidirectional"
        first = 0
        size = self.local_window_blocks[-1]
        for size in self.local_window_blocks:
            _window(layout, h, first, min(first + size, num_blocks), causal)
            first += size
        for start in range(first, num_blocks, size):  # the last size, repeated
            _window(layout, h, start, min(start + size, num_blocks), causal)
        return layout

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices
        ranges = ([(i, i + 1) for i in self.global_block_indices] if ends is None
                  else list(zip(self.global_block_indices, ends)))
        for start, stop in ranges:
            if start >= num_blocks:
                continue
            stop = min(stop, num_blocks)
            if self.horizontal_global_attention:
                layout[h, start:stop, :] = 1
            first_row = 0 if self.attention == "bidirectional" else start
            layout[h, first_row:, start:stop] = 1
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout)
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class BigBirdSparsityConfig(SparsityConfig):
    """BigBird (Zaheer et al. 2020), block-wise: ``num_random_blocks`` random blocks per row
    (from the blocks at or before the row when 'unidirectional'), a sliding window of
    ``num_sliding_window_blocks`` blocks, and the first ``num_global_blocks`` blocks global both
    ways; 'unidirectional' keeps the lower triangle of the result."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_direction(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention

    def set_random_layout(self, h, layout):
        _random_rows(layout, h, self.num_random_blocks,
                     causal_population=self.attention != "bidirectional")
        return layout

    def set_sliding_window_layout(self, h, layout):
        _sliding(layout, h, self.num_sliding_window_blocks, "num_sliding_window_blocks")
        return layout

    def set_global_layout_itc(self, h, layout):
        num_blocks = layout.shape[1]
        g = self.num_global_blocks
        if num_blocks < g:
            raise ValueError(f"num_global_blocks {g} is more than the {num_blocks} blocks of a row")
        layout[h, :g, :] = 1
        layout[h, :, :g] = 1
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout)
            self.set_sliding_window_layout(h, layout)
            layout = self.set_global_layout_itc(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class BSLongformerSparsityConfig(SparsityConfig):
    """Longformer (Beltagy et al. 2020), block-wise: a sliding window of
    ``num_sliding_window_blocks`` blocks and global blocks (``global_block_indices``, or ranges
    up to ``global_block_end_indices``) attended by and attending to every block;
    'unidirectional' keeps the lower triangle."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False,
                 num_sliding_window_blocks=3, global_block_indices=(0,),
                 global_block_end_indices=None, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = (None if global_block_end_indices is None
                                         else list(global_block_end_indices))
        self.attention = attention

    def set_sliding_window_layout(self, h, layout):
        _sliding(layout, h, self.num_sliding_window_blocks, "num_sliding_window_blocks")
        return layout

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices
        ranges = ([(i, i + 1) for i in self.global_block_indices] if ends is None
                  else list(zip(self.global_block_indices, ends)))
        for start, stop in ranges:
            if start < num_blocks:
                stop = min(stop, num_blocks)
                layout[h, start:stop, :] = 1
                layout[h, :, start:stop] = 1
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
            layout = self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """Purely local attention: each block row keeps the ``num_sliding_window_blocks // 2``
    blocks on each side ('bidirectional') or before it and itself ('unidirectional', the
    default). One pattern for all heads."""

    def __init__(self, num_heads, block=16, num_sliding_window_blocks=3,
                 attention="unidirectional"):
        super().__init__(num_heads, block)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention

    def set_sliding_window_layout(self, h, layout):
        _sliding(layout, h, self.num_sliding_window_blocks, "num_sliding_window_blocks",
                 bidirectional=self.attention == "bidirectional")
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)
