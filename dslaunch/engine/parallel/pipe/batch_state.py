"""What one run of a pipeline instruction stream (``PipelineEngine._execute``) holds between
instructions: the micro-batches in flight, the losses, the live counts, the per-op clock and the
receives posted ahead. One ``BatchState`` per ``train_batch`` / ``eval_batch``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class PostedReceives:
    """Receives posted ahead per channel (gloo moves a message only once its receive is posted).
    The next receive is posted only while the stream still has one on that channel: a receive
    left pending at shutdown would hang."""

    def __init__(self, p2p, instrs, peers: dict):
        self.p2p, self.peers = p2p, peers  # op -> (peer rank, channel kind)
        self.left = {op: sum(i.op == op for i in instrs) for op in peers}

    def post_first(self) -> None:
        for op, n in self.left.items():
            if n:
                self.p2p.prefetch(*self.peers[op])

    def recv(self, op: str):
        self.left[op] -= 1
        return self.p2p.recv(*self.peers[op], prefetch_next=self.left[op] > 0)


class OpClock:
    """Seconds per instruction kind: each tick charges the time since the last one to the op
    that was running."""

    def __init__(self, times: dict):
        self.times = times
        self.start = self.last = time.perf_counter()
        self.op = None

    def tick(self, op=None) -> float:
        now = time.perf_counter()
        if self.op is not None:
            self.times[self.op] += now - self.last
        self.last, self.op = now, op
        return now


@dataclass
class BatchState:
    data_iter: object
    train: bool
    first: bool  # this rank is the first pipeline stage (loads the inputs)
    last: bool  # the last stage (loads the labels, computes the loss)
    backward_scale: float  # the last stage multiplies its loss by it: loss scale / micro-batches
    receives: PostedReceives
    clock: OpClock
    inputs: dict = field(default_factory=dict)  # micro -> this stage's inputs
    outputs: dict = field(default_factory=dict)  # micro -> this stage's outputs
    labels: dict = field(default_factory=dict)
    grads_in: dict = field(default_factory=dict)  # micro -> grads of the inputs (to send back)
    grads_out: dict = field(default_factory=dict)  # micro -> grads of the outputs (received)
    losses: list = field(default_factory=list)
    live: int = 0  # micro-batches whose activations are held
    backwards_done: int = 0
    act_bytes: dict = field(default_factory=dict)  # micro -> bytes autograd saved (measuring)
    live_bytes: int = 0
