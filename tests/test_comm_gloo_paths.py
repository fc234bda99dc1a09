"""engine/comm/collectives.py on real gloo between spawned processes: reduce_scatter_tensor and
all_gather_into_tensor give bitwise the same results on the native, pairwise and all_reduce
paths (``DSLAUNCH_GLOO_COLLECTIVES``), synchronously and with async_op; on 3 ranks and on a
subgroup the pairwise path equals the rank-order sum / concatenation exactly; the emulated calls are
booked under their own names with path "all_reduce" and the all_reduce's sent bytes; a
reduce-scatter input not marked scratch is left untouched; inf / NaN pass the zero-filled
all-gather unchanged and -0.0 comes back as +0.0."""

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dslaunch.engine.comm.collectives import Comm, collective_paths
from helpers import end_spawned_rank

WORLD, CHUNK = 2, 1000


def _data(rank, dtype):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(WORLD * CHUNK, generator=g).to(dtype)


def _run(comm, rank, dtype, async_op):
    """(reduce-scatter output, all-gather output, input after the non-scratch reduce-scatter,
    input before)."""
    x = _data(rank, dtype)
    before = x.clone()
    rs = torch.empty(CHUNK, dtype=dtype)
    w = comm.reduce_scatter_tensor(rs, x, async_op=async_op)
    if w is not None:
        w.wait()
    rs2 = torch.empty(CHUNK, dtype=dtype)  # scratch input, in place
    w = comm.reduce_scatter_tensor(rs2, x.clone(), async_op=async_op, input_is_scratch=True)
    if w is not None:
        w.wait()
    ag = torch.full((WORLD * CHUNK,), 7.0, dtype=dtype)  # stale content must not leak through
    w = comm.all_gather_into_tensor(ag, x[:CHUNK].clone(), async_op=async_op)
    if w is not None:
        w.wait()
    return rs, rs2, ag, torch.equal(x, before)


def _worker(rank, init, out):
    import os

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    rec = {"same": {}, "untouched": [], "stats": {}, "special": None}
    for dtype in (torch.float32, torch.bfloat16):
        for async_op in (False, True):
            res = {}
            for path in ("native", "allreduce", "pairwise"):
                os.environ["DSLAUNCH_GLOO_COLLECTIVES"] = path
                comm = Comm()
                res[path] = _run(comm, rank, dtype, async_op)
                rec["untouched"].append(res[path][3])
                rec["stats"][f"{path}-{dtype}-{async_op}"] = comm.stats()
            a, b, c = res["native"], res["allreduce"], res["pairwise"]
            rec["same"][f"{dtype}-{async_op}"] = [torch.equal(a[i], b[i]) for i in range(3)] + [
                torch.equal(a[i], c[i]) for i in range(3)] + [torch.equal(a[0], a[1])]
    # special values through the zero-filled all-gather
    os.environ["DSLAUNCH_GLOO_COLLECTIVES"] = "allreduce"
    comm = Comm()
    mine = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1.5])
    ag = torch.empty(WORLD * 5)
    comm.all_gather_into_tensor(ag, mine)
    rec["special"] = [repr(v) for v in ag.tolist()]
    rec["signbit"] = torch.signbit(ag).tolist()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(rec, f)
    end_spawned_rank()


def test_native_and_all_reduce_paths_agree_bitwise(tmp_path):
    # spawn, not fork: an earlier in-process test may have left this process's default group
    # initialised, and a forked child would inherit it
    mp.start_processes(_worker, args=(f"file://{tmp_path}/rdzv", str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    for r in range(WORLD):
        rec = json.loads((tmp_path / f"{r}.json").read_text())
        assert all(all(v) for v in rec["same"].values()), rec["same"]
        assert all(rec["untouched"])
        st = rec["stats"]["allreduce-torch.float32-True"]
        nbytes = 4 * WORLD * CHUNK
        assert st["reduce_scatter"]["path"] == "all_reduce"
        assert st["all_gather"]["path"] == "all_reduce"
        # 2 ranks: an all_reduce sends the whole buffer once; the native calls half / one chunk
        assert st["reduce_scatter"]["sent_bytes"] == 2 * nbytes
        assert st["all_gather"]["sent_bytes"] == nbytes
        nat = rec["stats"]["native-torch.float32-True"]
        assert nat["reduce_scatter"]["path"] == "native"
        assert nat["reduce_scatter"]["sent_bytes"] == 2 * nbytes // 2
        assert nat["all_gather"]["sent_bytes"] == nbytes // 2
        assert st["reduce_scatter"]["calls"] == nat["reduce_scatter"]["calls"] == 2
        pw = rec["stats"]["pairwise-torch.float32-True"]
        assert pw["reduce_scatter"]["path"] == pw["all_gather"]["path"] == "pairwise"
        assert pw["reduce_scatter"]["sent_bytes"] == nat["reduce_scatter"]["sent_bytes"]
        assert pw["all_gather"]["sent_bytes"] == nat["all_gather"]["sent_bytes"]
        # inf, -inf, nan pass; -0.0 comes back +0.0; from both ranks
        assert rec["special"] == ["inf", "-inf", "nan", "0.0", "1.5"] * WORLD
        assert not any(rec["signbit"][3::5])


def _pairwise_worker(rank, world, init, out):
    """Pairwise reduce-scatter / all-gather on ``world`` ranks and on the subgroup of ranks 1..,
    against the exact rank-order sum and the concatenation, computed locally."""
    import os

    os.environ["DSLAUNCH_GLOO_COLLECTIVES"] = "pairwise"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sub = dist.new_group(list(range(1, world)))
    ok = []
    for group, members in ((None, list(range(world))), (sub, list(range(1, world)))):
        if rank not in members:
            continue
        comm = Comm(group)
        n, me = len(members), members.index(rank)
        data = {r: torch.randn(n * CHUNK, generator=torch.Generator().manual_seed(7 + r))
                for r in members}
        want = data[members[0]][me * CHUNK:(me + 1) * CHUNK].clone()
        for r in members[1:]:
            want += data[r][me * CHUNK:(me + 1) * CHUNK]
        for async_op in (False, True):
            got = torch.empty(CHUNK)
            w = comm.reduce_scatter_tensor(got, data[rank].clone(), async_op=async_op)
            if w is not None:
                w.wait()
            ok.append(torch.equal(got, want))
            full = torch.full((n * CHUNK,), 7.0)
            full[me * CHUNK:(me + 1) * CHUNK].copy_(data[rank][:CHUNK])
            # the input may be this rank's own slot of the output
            w = comm.all_gather_into_tensor(full, full[me * CHUNK:(me + 1) * CHUNK],
                                            async_op=async_op)
            if w is not None:
                w.wait()
            ok.append(torch.equal(full, torch.cat([data[r][:CHUNK] for r in members])))
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(ok, f)
    end_spawned_rank()


def test_pairwise_path_is_exact_on_three_ranks_and_a_subgroup(tmp_path):
    world = 3
    mp.start_processes(_pairwise_worker, args=(world, f"file://{tmp_path}/rdzv", str(tmp_path)),
                       nprocs=world, start_method="spawn")
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    assert [len(r) for r in results] == [4, 8, 8]
    assert all(all(r) for r in results), results


def test_path_choice():
    assert collective_paths("nccl", {"DSLAUNCH_GLOO_COLLECTIVES": "allreduce"}) == {
        "reduce_scatter": "native", "all_gather": "native"}
    assert collective_paths("gloo", {"DSLAUNCH_GLOO_COLLECTIVES": "native"}) == {
        "reduce_scatter": "native", "all_gather": "native"}
    assert collective_paths("gloo", {"DSLAUNCH_GLOO_COLLECTIVES": "allreduce"}) == {
        "reduce_scatter": "all_reduce", "all_gather": "all_reduce"}
    assert collective_paths("gloo", {"DSLAUNCH_GLOO_COLLECTIVES": "pairwise"}) == {
        "reduce_scatter": "pairwise", "all_gather": "pairwise"}
    assert collective_paths("gloo", {}) == {"reduce_scatter": "pairwise", "all_gather": "pairwise"}
    with pytest.raises(ValueError, match="DSLAUNCH_GLOO_COLLECTIVES"):
        collective_paths("gloo", {"DSLAUNCH_GLOO_COLLECTIVES": "fast"})


def test_per_device_backend_routes_cpu_tensors_to_gloo():
    """On a GPU machine the NCCL group is ``cpu:gloo,cuda:nccl``: a CPU tensor meets gloo (and
    gloo's collective paths), a CUDA tensor NCCL; a plain backend serves every device."""
    from dslaunch.engine.comm.collectives import group_backend, with_cpu_backend

    assert group_backend("cpu:gloo,cuda:nccl", "cpu") == "gloo"
    assert group_backend("cpu:gloo,cuda:nccl", "cuda") == "nccl"
    assert group_backend("gloo", "cuda") == "gloo" and group_backend(None, "cpu") is None
    assert with_cpu_backend("gloo") == "gloo"
    assert with_cpu_backend("nccl") == ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "nccl")
    assert collective_paths(group_backend("cpu:gloo,cuda:nccl", "cpu"), {}) == collective_paths("gloo", {})
