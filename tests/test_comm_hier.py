"""The hierarchical gloo path (engine/comm/hierarchical.py): exact reduce-scatter and all-gather over a
group that spans (fake) hosts, several in flight at once and waited in any order, and each piece
crossing to another host once: the bytes sent to other hosts, counted at ``dist.isend``, are
(H - 1) x the gathered output, against R (H - 1) x on the flat pairwise path."""

import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import end_spawned_rank

WORLD, CHUNK = 4, 1000


def _worker(rank, init, out):
    import os

    os.environ["DSLAUNCH_FAKE_HOSTS"] = "2"  # ranks 0, 1 on host 0; 2, 3 on host 1
    from dslaunch.engine.comm import host_groups
    from dslaunch.engine.comm.collectives import Comm
    from dslaunch.engine.comm.hierarchical import HostRanks

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    host_of = host_groups.topology().host_of
    sent = {"inter": 0, "intra": 0}
    isend = dist.isend

    def counting_isend(tensor, dst, *a, **k):
        sent["inter" if host_of[dst] != host_of[rank] else "intra"] += tensor.numel() * 4
        return isend(tensor, dst, *a, **k)

    dist.isend = counting_isend
    rec = {"ok": [], "inter": {}}
    labelled = Comm()
    host_groups.label(labelled)
    rec["layout"] = labelled.hosts.hosts if labelled.hosts else None
    # the same hosts, with the group's ranks interleaved across them
    interleaved = Comm()
    interleaved.hosts = HostRanks([[0, 2], [1, 3]], rank)
    host_of = (0, 0, 1, 1)
    flat = Comm()
    for name, comm in (("labelled", labelled), ("flat", flat)):
        for k in sent:
            sent[k] = 0
        # integer values: every summation order gives the same sums
        data = [torch.randint(-50, 50, (WORLD * CHUNK,), generator=torch.Generator().manual_seed(r + 3 * i))
                .float() for i in range(3) for r in range(WORLD)]
        works, outs = [], []
        for i in range(3):  # three of each in flight, waited in reverse order
            got = torch.empty(CHUNK)
            works.append(comm.reduce_scatter_tensor(got, data[i * WORLD + rank].clone(), async_op=True))
            full = torch.full((WORLD * CHUNK,), 7.0)
            full[rank * CHUNK:(rank + 1) * CHUNK] = data[i * WORLD + rank][:CHUNK]
            works.append(comm.all_gather_into_tensor(
                full, full[rank * CHUNK:(rank + 1) * CHUNK], async_op=True))
            outs.append((i, got, full))
        for w in reversed(works):
            w.wait()
        for i, got, full in outs:
            want = sum(data[i * WORLD + r][rank * CHUNK:(rank + 1) * CHUNK] for r in range(WORLD))
            rec["ok"].append(torch.equal(got, want))
            rec["ok"].append(torch.equal(full, torch.cat([data[i * WORLD + r][:CHUNK]
                                                          for r in range(WORLD)])))
        rec["inter"][name] = sent["inter"]
        if name == "labelled":  # the comm stats book the bytes that crossed hosts as such
            st = comm.stats()
            rec["booked_inter"] = sum(st[c]["links"]["inter_host"]["sent_bytes"]
                                      for c in ("all_gather", "reduce_scatter"))
            rec["booked_total"] = sum(st[c]["sent_bytes"] for c in ("all_gather", "reduce_scatter"))
        rec["paths"] = rec.get("paths", []) + [comm.stats()["all_gather"]["path"]]
    host_of = (0, 1, 0, 1)
    got = torch.empty(CHUNK)
    mine = torch.arange(WORLD * CHUNK, dtype=torch.float32) * (rank + 1)
    interleaved.reduce_scatter_tensor(got, mine)
    rec["ok"].append(torch.equal(got, torch.arange(rank * CHUNK, (rank + 1) * CHUNK,
                                                   dtype=torch.float32) * 10))
    full = torch.empty(WORLD * CHUNK)
    interleaved.all_gather_into_tensor(full, torch.full((CHUNK,), float(rank)))
    rec["ok"].append(torch.equal(full, torch.arange(WORLD).float().repeat_interleave(CHUNK)))
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(rec, f)
    end_spawned_rank()


def test_hierarchical_path_is_exact_and_crosses_hosts_once(tmp_path):
    mp.start_processes(_worker, args=(f"file://{tmp_path}/rdzv", str(tmp_path)), nprocs=WORLD,
                       start_method="spawn")
    recs = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for rec in recs:
        assert rec["ok"] and all(rec["ok"]), rec["ok"]
        assert rec["layout"] == [[0, 1], [2, 3]]
        assert rec["paths"] == ["hierarchical", "pairwise"]
        assert rec["booked_inter"] == rec["inter"]["labelled"] < rec["booked_total"]
    out = 4 * WORLD * CHUNK  # bytes of one gathered output (= one reduce-scatter input)
    hier = sum(r["inter"]["labelled"] for r in recs)
    flat = sum(r["inter"]["flat"] for r in recs)
    # 3 all-gathers and 3 reduce-scatters; H = 2 hosts of R = 2 ranks
    assert hier == 3 * (1 * out) + 3 * (1 * out)
    assert flat == 2 * hier
