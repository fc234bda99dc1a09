"""The pipeline executor's pieces that need no process group: the instruction table covers every
op the schedules emit, receives are posted ahead only while the stream has more on a channel,
and the per-op clock charges each interval to the op that ran."""

from collections import defaultdict

import pytest

from dslaunch.engine.core.pipe_engine import PipelineEngine
from dslaunch.engine.parallel.pipe import batch_state
from dslaunch.engine.parallel.pipe.batch_state import OpClock, PostedReceives
from dslaunch.engine.parallel.pipe.schedule import gpipe, inference, one_f_one_b


@pytest.mark.parametrize("schedule", [one_f_one_b, gpipe, inference])
def test_every_scheduled_op_has_an_instruction_method(schedule):
    ops = {i.op for s in range(3) for i in schedule(3, s, 4)}
    assert ops <= set(PipelineEngine._INSTRUCTIONS)


class _FakeP2P:
    def __init__(self):
        self.calls = []

    def prefetch(self, peer, kind):
        self.calls.append(("prefetch", peer, kind))

    def recv(self, peer, kind, prefetch_next):
        self.calls.append(("recv", peer, kind, prefetch_next))
        return kind


def test_receives_are_posted_ahead_but_never_past_the_stream():
    instrs = one_f_one_b(3, 1, 2)  # a middle stage: 2 recv_act, 2 recv_grad
    p2p = _FakeP2P()
    receives = PostedReceives(p2p, instrs, {"recv_act": (0, "act"), "recv_grad": (2, "grad")})
    receives.post_first()
    assert p2p.calls == [("prefetch", 0, "act"), ("prefetch", 2, "grad")]
    got = [receives.recv(op) for op in ("recv_act", "recv_grad", "recv_act", "recv_grad")]
    assert got == ["act", "grad", "act", "grad"]
    assert [c[3] for c in p2p.calls[2:]] == [True, True, False, False]


def test_nothing_is_posted_for_a_channel_the_stream_never_reads():
    p2p = _FakeP2P()
    PostedReceives(p2p, inference(2, 0, 3), {"recv_act": (None, "act"),
                                             "recv_grad": (1, "grad")}).post_first()
    assert p2p.calls == []


def test_op_clock_charges_each_interval_to_the_op_that_ran(monkeypatch):
    now = iter([0.0, 1.0, 3.0, 6.0])
    monkeypatch.setattr(batch_state.time, "perf_counter", lambda: next(now))
    times = defaultdict(float)
    clock = OpClock(times)  # t=0
    clock.tick("forward")  # t=1: nothing ran before
    clock.tick("backward")  # t=3: forward ran 2 s
    assert clock.tick() == 6.0  # the end: backward ran 3 s
    assert dict(times) == {"forward": 2.0, "backward": 3.0} and clock.start == 0.0
