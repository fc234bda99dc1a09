"""Pipeline schedules as instruction streams, one per stage (pure Python, no torch).

A stream is a list of ``Instr(op, micro)``. Ops:
``load`` (first stage: the micro-batch's inputs; last stage: its labels), ``recv_act``,
``forward``, ``send_act``, ``recv_grad``, ``backward``, ``send_grad``, then once per batch
``reduce_tied`` (sum tied-weight gradients over their owner stages) and ``step``.

Sends are non-blocking and receives block (the executor posts ``isend`` and waits for all of them
at the end of the batch), so a stream set is deadlock-free when every receive's matching send is
reachable without waiting on that receive; ``simulate`` checks exactly that, and that every
receive gets the micro-batch it expects, in order.

- GPipe: all forwards, then all backwards (every stage holds M micro-batches of activations).
- 1F1B (PipeDream-flush, DeepSpeed's TrainSchedule): stage s runs ``min(P - s - 1, M)`` warm-up
  forwards, then alternates one forward / one backward, then drains the remaining backwards;
  stage s never holds more than ``P - s`` micro-batches of activations.
Both run backwards in micro-batch order, so the last backward is the accumulation boundary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instr:
    op: str
    micro: int = -1

    def __repr__(self) -> str:
        return f"{self.op}({self.micro})" if self.micro >= 0 else self.op


def _fwd(stage: int, stages: int, m: int) -> list:
    out = []
    if stage > 0:
        out.append(Instr("recv_act", m))
    if stage == 0 or stage == stages - 1:
        out.append(Instr("load", m))
    out.append(Instr("forward", m))
    if stage < stages - 1:
        out.append(Instr("send_act", m))
    return out


def _bwd(stage: int, stages: int, m: int) -> list:
    out = []
    if stage < stages - 1:
        out.append(Instr("recv_grad", m))
    out.append(Instr("backward", m))
    if stage > 0:
        out.append(Instr("send_grad", m))
    return out


def _check(stages: int, stage: int, micro_batches: int) -> None:
    if stages < 1 or not 0 <= stage < stages:
        raise ValueError(f"pipeline schedule: stage {stage} of {stages} stages")
    if micro_batches < 1:
        raise ValueError(f"pipeline schedule: {micro_batches} micro-batches; need at least 1")


def gpipe(stages: int, stage: int, micro_batches: int) -> list:
    _check(stages, stage, micro_batches)
    out = []
    for m in range(micro_batches):
        out += _fwd(stage, stages, m)
    for m in range(micro_batches):
        out += _bwd(stage, stages, m)
    return out + [Instr("reduce_tied"), Instr("step")]


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> list:
    _check(stages, stage, micro_batches)
    warmup = min(stages - stage - 1, micro_batches)
    out = []
    for m in range(warmup):
        out += _fwd(stage, stages, m)
    for i in range(micro_batches - warmup):
        out += _fwd(stage, stages, warmup + i)
        out += _bwd(stage, stages, i)
    for m in range(micro_batches - warmup, micro_batches):
        out += _bwd(stage, stages, m)
    return out + [Instr("reduce_tied"), Instr("step")]


def inference(stages: int, stage: int, micro_batches: int) -> list:
    """Forward only (``eval_batch``)."""
    _check(stages, stage, micro_batches)
    out = []
    for m in range(micro_batches):
        out += _fwd(stage, stages, m)
    return out


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def get_schedule(name: str):
    key = str(name).lower().replace("-", "").replace("_", "")
    aliases = {"1f1b": "1f1b", "pipedream": "1f1b", "train": "1f1b", "gpipe": "gpipe"}
    if key not in aliases:
        raise ValueError(f"pipeline schedule {name!r}: choose one of {sorted(SCHEDULES)}")
    return SCHEDULES[aliases[key]]


class DeadlockError(RuntimeError):
    pass


def simulate(schedule, stages: int, micro_batches: int) -> dict:
    """Run the streams of every stage against each other with non-blocking sends and blocking
    receives (FIFO channels per direction). Raises ``DeadlockError`` when no stage can move, and
    ``AssertionError`` when a receive gets another micro-batch than it expects, a backward comes
    before its forward, or a stream does not run every micro-batch forward and backward once.
    Returns ``{"order": [(stage, Instr), ...], "peak_live": [max activations held per stage]}``."""
    streams = [schedule(stages, s, micro_batches) for s in range(stages)]
    pcs = [0] * stages
    chans: dict = {}  # (src, dst, kind) -> FIFO of micro ids
    live, peak = [set() for _ in range(stages)], [0] * stages
    done_fwd, done_bwd = [[] for _ in range(stages)], [[] for _ in range(stages)]
    order = []
    while any(pc < len(st) for pc, st in zip(pcs, streams)):
        moved = False
        for s in range(stages):
            while pcs[s] < len(streams[s]):
                ins = streams[s][pcs[s]]
                if ins.op in ("recv_act", "recv_grad"):
                    src, kind = (s - 1, "act") if ins.op == "recv_act" else (s + 1, "grad")
                    q = chans.get((src, s, kind))
                    if not q:
                        break  # blocked
                    got = q.pop(0)
                    assert got == ins.micro, f"stage {s} {ins} received micro-batch {got}"
                elif ins.op in ("send_act", "send_grad"):
                    dst, kind = (s + 1, "act") if ins.op == "send_act" else (s - 1, "grad")
                    assert 0 <= dst < stages, f"stage {s} {ins} sends outside the pipeline"
                    chans.setdefault((s, dst, kind), []).append(ins.micro)
                elif ins.op == "forward":
                    assert ins.micro not in done_fwd[s], f"stage {s}: forward twice {ins}"
                    done_fwd[s].append(ins.micro)
                    live[s].add(ins.micro)
                    peak[s] = max(peak[s], len(live[s]))
                elif ins.op == "backward":
                    assert ins.micro in live[s], f"stage {s}: {ins} before its forward"
                    done_bwd[s].append(ins.micro)
                    live[s].discard(ins.micro)
                order.append((s, ins))
                pcs[s] += 1
                moved = True
        if not moved:
            stuck = {s: streams[s][pcs[s]] for s in range(stages) if pcs[s] < len(streams[s])}
            raise DeadlockError(f"pipeline schedule deadlocks: {stuck}")
    for s in range(stages):
        assert sorted(done_fwd[s]) == list(range(micro_batches)), (s, done_fwd[s])
        if any(i.op == "backward" for i in streams[s]):
            assert done_bwd[s] == list(range(micro_batches)), (s, done_bwd[s])
    assert all(not q for q in chans.values()), f"unreceived messages: {chans}"
    return {"order": order, "peak_live": peak}
