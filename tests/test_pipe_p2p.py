"""pipe/p2p.py over real gloo between two processes: messages of changing layouts (a tensor, a
tuple of mixed dtypes, smaller shapes, a 0-dim tensor) arrive intact on two channels at once,
whether their receive was posted ahead or not; shapes travel only when they change, and a fixed
layout costs one transport send per message."""

import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dslaunch.engine.parallel.pipe.p2p import P2P
from helpers import end_spawned_rank


def _messages(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, 3, generator=g)
    tup = (torch.randn(2, 3, generator=g), torch.arange(4), torch.tensor([True, False, True]))
    return [a, a * 2, tup, tuple(t.clone() for t in tup),        # tensor, tensor, tuple, tuple
            torch.randn(1, 3, generator=g),                      # smaller
            torch.tensor(7.5), torch.tensor(8.5),                # 0-dim
            torch.randn(2, 3, generator=g).to(torch.bfloat16)]   # another dtype


def _same(got, want) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    return (isinstance(got, torch.Tensor) and got.dtype == want.dtype
            and got.shape == want.shape and torch.equal(got, want))


def _worker(rank, init, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    p2p, other = P2P(), 1 - rank
    sent, expected = _messages(rank), _messages(other)
    ok = []
    for i, (mine, theirs) in enumerate(zip(sent, expected)):  # both directions at once
        p2p.send(mine, other, "act" if rank == 0 else "grad")
        # every other receive posts the next one ahead: layout changes land on both paths
        got = p2p.recv(other, "grad" if rank == 0 else "act", prefetch_next=i % 2 == 0)
        ok.append(_same(got, theirs))
    p2p.wait_all()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump({"ok": ok, "stats": p2p.stats}, f)
    end_spawned_rank()


def test_layouts_change_and_fixed_layout_sends_once(tmp_path):
    # spawn, not fork: an earlier in-process test may have left this process's default group
    # initialised, and a forked child would inherit it
    mp.start_processes(_worker, args=(f"file://{tmp_path}/rdzv", str(tmp_path)), nprocs=2,
                       start_method="spawn")
    for r in range(2):
        got = json.loads((tmp_path / f"{r}.json").read_text())
        assert all(got["ok"]), got
        stats = got["stats"]
        # layouts: tensor(2,3) | tuple | tensor(1,3) | 0-dim | bf16(2,3): 5 headers, and each
        # of the 4 changes also sends one discarded buffer of the old size
        assert stats["messages"] == 8 and stats["headers_with_shapes"] == 5
        assert stats["transfers"] == 8 + 5 + 4
