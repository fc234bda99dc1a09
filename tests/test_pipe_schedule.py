"""Pipeline schedules: the instruction streams of 1F1B and GPipe, simulated against each other
with non-blocking sends and blocking receives (as the executor runs them), for many
(stages, micro-batches): deadlock-free, every receive gets the micro-batch it expects, every
backward after its forward, and 1F1B holds at most ``stages - s`` micro-batches on stage s."""

import pytest

from dslaunch.engine.parallel.pipe.schedule import (
    DeadlockError,
    Instr,
    get_schedule,
    gpipe,
    inference,
    one_f_one_b,
    simulate,
)

SHAPES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 4), (2, 7), (3, 2), (3, 5), (4, 1), (4, 3), (4, 4),
          (4, 8), (5, 9), (8, 8), (8, 16)]


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_one_f_one_b_deadlock_free_bounded_memory(stages, micro):
    res = simulate(one_f_one_b, stages, micro)
    for s, peak in enumerate(res["peak_live"]):
        assert peak == min(stages - s, micro), (s, res["peak_live"])


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_gpipe_deadlock_free_holds_all(stages, micro):
    res = simulate(gpipe, stages, micro)
    assert res["peak_live"] == [micro] * stages


@pytest.mark.parametrize("stages,micro", SHAPES)
def test_inference_forward_only(stages, micro):
    res = simulate(inference, stages, micro)
    assert all(i.op not in ("backward", "recv_grad") for _, i in res["order"])


def test_one_f_one_b_order_on_two_stages():
    """Stage 0 warms up with one forward, then alternates; the last stage alternates from the
    start; the step comes after the tied-gradient reduction."""
    s0 = [repr(i) for i in one_f_one_b(2, 0, 3)]
    assert s0 == ["load(0)", "forward(0)", "send_act(0)",
                  "load(1)", "forward(1)", "send_act(1)", "recv_grad(0)", "backward(0)",
                  "load(2)", "forward(2)", "send_act(2)", "recv_grad(1)", "backward(1)",
                  "recv_grad(2)", "backward(2)", "reduce_tied", "step"]
    s1 = [repr(i) for i in one_f_one_b(2, 1, 3)]
    assert s1 == ["recv_act(0)", "load(0)", "forward(0)", "backward(0)", "send_grad(0)",
                  "recv_act(1)", "load(1)", "forward(1)", "backward(1)", "send_grad(1)",
                  "recv_act(2)", "load(2)", "forward(2)", "backward(2)", "send_grad(2)",
                  "reduce_tied", "step"]


def test_gpipe_order():
    ops = [i.op for i in gpipe(3, 1, 2) if i.op in ("forward", "backward")]
    assert ops == ["forward", "forward", "backward", "backward"]


def test_simulator_catches_deadlock_and_misorder():
    """The checks can fail: a schedule whose middle stage receives gradients before sending its
    activations deadlocks; one that receives micro-batches out of order is caught."""
    def bad_deadlock(stages, s, m):
        out = one_f_one_b(stages, s, m)
        if s == 0:  # receive grad(0) before sending act(0)
            i = out.index(Instr("send_act", 0))
            j = out.index(Instr("recv_grad", 0))
            out[i], out[j] = out[j], out[i]
        return out

    with pytest.raises(DeadlockError):
        simulate(bad_deadlock, 2, 2)

    def bad_order(stages, s, m):
        out = gpipe(stages, s, m)
        if s == 1:
            i, j = out.index(Instr("recv_act", 0)), out.index(Instr("recv_act", 1))
            out[i], out[j] = Instr("recv_act", 1), Instr("recv_act", 0)
        return out

    with pytest.raises(AssertionError, match="received micro-batch"):
        simulate(bad_order, 2, 2)


def test_schedule_names():
    assert get_schedule("1F1B") is one_f_one_b
    assert get_schedule("gpipe") is gpipe
    with pytest.raises(ValueError, match="1f1b"):
        get_schedule("interleaved")
    with pytest.raises(ValueError):
        one_f_one_b(2, 2, 4)
    with pytest.raises(ValueError):
        gpipe(2, 0, 0)
