"""``dslaunch.comm`` (DeepSpeed's ``deepspeed.comm``) on 2 gloo ranks started as a launcher would
(RANK / WORLD_SIZE / MASTER_ADDR in the environment, Accelerate's guarded ``init_distributed``):
every collective and point-to-point call gives torch.distributed's result, synchronously and with
async handles, on the world and on subgroups, and is booked (calls, bytes) in the table the
engine on that process reports: ``engine.comm_stats()`` of a data-parallel engine for the world,
of a tensor-parallel engine for its data group; ``log_summary`` returns and prints the same."""

import contextlib
import io
import json
import os
import socket

import torch
import torch.multiprocessing as mp

from dslaunch.engine.comm.collectives import sent_bytes
from helpers import end_spawned_rank

WORLD, N = 2, 8
CONFIG = {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}


def _results_equal(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_results_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


class _Checker:
    """Runs a call through dslaunch.comm and the same call through torch.distributed on copies of
    the same inputs; records whether the results agree and what ``stats()`` booked meanwhile."""

    def __init__(self, stats):
        self.stats, self.out = stats, {}

    def __call__(self, label, booked_as, ours, theirs):
        before = self.stats().get(booked_as, {"calls": 0, "bytes": 0})
        got = ours()
        after = self.stats().get(booked_as, {"calls": 0, "bytes": 0})
        self.out[label] = {"same": _results_equal(got, theirs()),
                           "calls": after["calls"] - before["calls"],
                           "bytes": after["bytes"] - before["bytes"]}


def _collectives(check, ds, td, rank, group=None):
    """Every collective of the face on ``group`` (None: the world); ranks are global ones."""
    g = {"group": group}
    x = torch.arange(N, dtype=torch.float32) + 10 * rank + 0.5
    big = torch.arange(WORLD * N, dtype=torch.float32) * (rank + 1)
    all_gather_flat = getattr(td, "all_gather_single", None) or td.all_gather_into_tensor
    rs_flat = getattr(td, "reduce_scatter_single", None) or td.reduce_scatter_tensor

    def run(fn, *args, out=None, async_op=False, **kw):
        """``fn(out, *args)`` (out: a copy of x by default); with async_op, waits the handle."""
        t = x.clone() if out is None else out
        if async_op:
            fn(t, *args, async_op=True, **kw, **g).wait()
        else:
            fn(t, *args, **kw, **g)
        return t

    check("all_reduce", "all_reduce", lambda: run(ds.all_reduce), lambda: run(td.all_reduce))
    check("all_reduce_max", "all_reduce", lambda: run(ds.all_reduce, op=ds.ReduceOp.MAX),
          lambda: run(td.all_reduce, op=td.ReduceOp.MAX))
    check("inference_all_reduce", "all_reduce", lambda: run(ds.inference_all_reduce),
          lambda: run(td.all_reduce))
    check("all_reduce_async", "all_reduce",
          lambda: run(ds.all_reduce, async_op=True),
          lambda: run(td.all_reduce))
    check("broadcast", "broadcast", lambda: run(ds.broadcast, 1), lambda: run(td.broadcast, 1))
    check("broadcast_async", "broadcast",
          lambda: run(ds.broadcast, 1, async_op=True),
          lambda: run(td.broadcast, 1))

    def reduced(fn):  # the result is defined on the destination only
        t = run(fn, 1)
        return t if rank == 1 else 0

    check("reduce", "reduce", lambda: reduced(ds.reduce), lambda: reduced(td.reduce))

    def gather_list(fn):
        outs = [torch.empty(N) for _ in range(WORLD)]
        fn(outs, x, **g)
        return outs

    check("all_gather", "all_gather", lambda: gather_list(ds.all_gather),
          lambda: gather_list(td.all_gather))
    for label, fn, async_op in (("all_gather_into_tensor", ds.all_gather_into_tensor, False),
                                ("allgather_fn", ds.allgather_fn, False),
                                ("all_gather_into_tensor_async", ds.all_gather_into_tensor, True)):
        check(label, "all_gather",
              lambda fn=fn, a=async_op: run(fn, x, out=torch.empty(WORLD * N), async_op=a),
              lambda: run(all_gather_flat, x, out=torch.empty(WORLD * N)))
    for label, fn, async_op in (("reduce_scatter_tensor", ds.reduce_scatter_tensor, False),
                                ("reduce_scatter_fn", ds.reduce_scatter_fn, False),
                                ("reduce_scatter_tensor_async", ds.reduce_scatter_tensor, True)):
        check(label, "reduce_scatter",
              lambda fn=fn, a=async_op: run(fn, big, out=torch.empty(N), async_op=a),
              lambda: run(rs_flat, big, out=torch.empty(N)))
    check("all_to_all_single", "all_to_all",
          lambda: run(ds.all_to_all_single, x, out=torch.empty(N)),
          lambda: run(td.all_to_all_single, x, out=torch.empty(N)))

    def gathered(fn):
        outs = [torch.empty(N) for _ in range(WORLD)] if rank == 0 else None
        fn(x, outs, 0, **g)
        return outs or 0

    check("gather", "gather", lambda: gathered(ds.gather), lambda: gathered(td.gather))

    def scattered(fn):
        out = torch.empty(N)
        fn(out, [x * 2, x * 3] if rank == 1 else None, 1, **g)
        return out

    check("scatter", "scatter", lambda: scattered(ds.scatter), lambda: scattered(td.scatter))
    check("barrier", "barrier", lambda: ds.barrier(**g), lambda: td.barrier(**g))
    check("barrier_async", "barrier", lambda: ds.barrier(async_op=True, **g).wait(),
          lambda: True)
    check("monitored_barrier", "monitored_barrier", lambda: ds.monitored_barrier(**g),
          lambda: td.monitored_barrier(**g))

    # point to point: rank 0 sends, rank 1 receives (the sender's rank is what recv returns)
    side = "send" if rank == 0 else "recv"

    def p2p(send, recv):
        if rank == 0:
            return send(x, 1, **g)
        t = torch.empty(N)
        return [recv(t, 0, **g), t]

    check("send_recv", side, lambda: p2p(ds.send, ds.recv), lambda: p2p(td.send, td.recv))
    check("isend_irecv", side,
          lambda: p2p(lambda t, d, **k: ds.isend(t, d, **k).wait(),
                      lambda t, s, **k: ds.irecv(t, s, **k).wait()),
          lambda: p2p(lambda t, d, **k: td.isend(t, d, **k).wait(),
                      lambda t, s, **k: td.irecv(t, s, **k).wait()))
    check("recv_any_source", side, lambda: p2p(ds.send, lambda t, s, **k: ds.recv(t, **k)),
          lambda: p2p(td.send, lambda t, s, **k: td.recv(t, **k)))


def _tiny_engine(**kw):
    import dslaunch

    torch.manual_seed(0)
    engine, *_ = dslaunch.initialize(model=torch.nn.Linear(4, 2), config=CONFIG, **kw)
    return engine


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    import torch.distributed as td

    # a DeepSpeed script's `from deepspeed import comm as dist`
    from dslaunch import comm as dist

    rec = {"initialized_before": dist.is_initialized()}
    for _ in range(2):  # Accelerate's guarded call; the second does nothing
        if not dist.is_initialized():
            dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rec["layout"] = [dist.get_rank(), dist.get_world_size(), dist.get_local_rank(),
                     dist.get_backend(), dist.is_available(), dist.has_all_gather_into_tensor(),
                     dist.has_reduce_scatter_tensor()]

    engine = _tiny_engine()
    world = _Checker(engine.comm_stats)
    _collectives(world, dist, td, rank)
    rec["world"] = world.out

    # the engine's own collectives book into the same table as the script's
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    summary_out = io.StringIO()
    with contextlib.redirect_stdout(summary_out):
        summary = dist.log_summary(return_dict=True)["booked"]
    rec["summary_is_engine_stats"] = summary["world"] == engine.comm_stats()
    rec["summary_printed"] = summary_out.getvalue()

    # a subgroup of both ranks (not the world object): its own record, global ranks in src/dst
    both = dist.new_group([0, 1])
    rec["global_rank"] = [dist.get_global_rank(both, 1), dist.get_global_rank(None, 1)]
    engine_before = engine.comm_stats()
    sub = _Checker(lambda: dist.log_summary(return_dict=True)["booked"].get("ranks 0,1", {}))
    with contextlib.redirect_stdout(io.StringIO()):
        _collectives(sub, dist, td, rank, group=both)
    rec["sub"] = sub.out
    rec["engine_untouched_by_subgroup"] = engine.comm_stats() == engine_before

    # a group of rank 1 alone: rank 0 is outside it, its call is torch's no-op, booked nowhere
    solo = dist.new_group([1])
    t = torch.ones(N)
    dist.all_reduce(t, group=solo)
    with contextlib.redirect_stdout(io.StringIO()):
        rec["solo"] = [t.tolist(), dist.log_summary(return_dict=True)["booked"].get("ranks 1")]

    # a tensor-parallel engine reduces over its mpu's data group: the script's calls on that
    # group book into that engine's table, not the world engine's
    from dslaunch.engine.parallel.topology import build_grid

    grid = build_grid(pipe=1, model=1)
    tp_engine = _tiny_engine(mpu=grid)
    world_before = engine.comm_stats()
    t = torch.ones(N)
    work = dist.all_reduce(t, group=grid.get_data_parallel_group(), async_op=True)
    work.wait()
    rec["tp"] = [t.tolist(), tp_engine.comm_stats().get("all_reduce", {}).get("calls"),
                 tp_engine.comm_stats().get("all_reduce", {}).get("bytes"),
                 engine.comm_stats() == world_before]

    dist.destroy_process_group()
    rec["destroyed"] = dist.is_initialized()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(rec, f)
    end_spawned_rank()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# payload booked per call: the tensor handed in (reduce-scatter: the whole input; gather,
# scatter: this rank's piece; barriers: nothing)
PAYLOAD = {"reduce_scatter_tensor": 4 * WORLD * N, "reduce_scatter_fn": 4 * WORLD * N,
           "reduce_scatter_tensor_async": 4 * WORLD * N, "barrier": 0, "barrier_async": 0,
           "monitored_barrier": 0}


def _assert_booked_and_equal(results):
    assert len(results) == 23, sorted(results)
    for label, r in results.items():
        assert r["same"], label
        assert (r["calls"], r["bytes"]) == (1, PAYLOAD.get(label, 4 * N)), (label, r)


def test_comm_face_matches_torch_and_books_into_the_engines_table(tmp_path):
    # spawn, not fork: this process may already hold a default group from another test
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    for rank in range(WORLD):
        rec = json.loads((tmp_path / f"{rank}.json").read_text())
        assert rec["initialized_before"] is False and rec["destroyed"] is False
        assert rec["layout"] == [rank, WORLD, rank, "gloo", True, True, True]
        _assert_booked_and_equal(rec["world"])
        assert rec["summary_is_engine_stats"]
        if rank == 0:
            assert "all_reduce" in rec["summary_printed"] and "world" in rec["summary_printed"]
        else:
            assert rec["summary_printed"] == ""  # rank 0 prints
        assert rec["global_rank"] == [1, 1]
        _assert_booked_and_equal(rec["sub"])
        assert rec["engine_untouched_by_subgroup"]
        ones, booked = rec["solo"]
        assert ones == [1.0] * N
        assert booked == (None if rank == 0 else
                          {"all_reduce": {"calls": 1, "bytes": 4 * N, "sent_bytes": 0,
                                          "seconds": booked["all_reduce"]["seconds"]}})
        assert rec["tp"] == [[2.0] * N, 1, 4 * N, True]


def test_sent_bytes_of_the_face_collectives():
    """What each rank sends to the others, 4 ranks, 400 bytes handed in."""
    expect = {"all_reduce": 600, "all_gather": 1200, "reduce_scatter": 300, "all_to_all": 300,
              "broadcast": 300, "reduce": 300, "gather": 300, "scatter": 300, "send": 400,
              "recv": 0, "barrier": 0, "monitored_barrier": 0}
    assert {k: sent_bytes(k, 400, 4) for k in expect} == expect
    assert sent_bytes("send", 400, 1) == 0
