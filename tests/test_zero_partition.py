"""Pure bookkeeping of the ZeRO layout (one process): buckets, padding, shard pieces, resharding
between world sizes, and dslaunch.zero.GatheredParameters on a one-rank strategy."""

import torch

from dslaunch.engine.base.partition import Layout, build_layout, chunk_views, flatten_into
from dslaunch.engine.storage.shard_index import ParamIndex, relayout, reshard


def _params():
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (13,), (4, 4, 3), (1,), (30,)]
    return [(f"p{i}", torch.nn.Parameter(torch.randn(s))) for i, s in enumerate(shapes)]


def test_buckets_pad_to_world_and_never_split_a_parameter():
    named = _params()
    lay = build_layout(named, world_size=3, bucket_numel=40)
    assert [s.name for b in lay.buckets for s in b.slots] == [n for n, _ in reversed(named)]
    for b in lay.buckets:
        used = sum(s.numel for s in b.slots)
        assert b.numel % 3 == 0 and used <= b.numel < used + 3
        assert used <= 40 or len(b.slots) == 1  # an oversize parameter gets its own bucket
    assert Layout.from_meta(lay.meta()).meta() == lay.meta()


def test_shard_pieces_cover_every_element_once():
    named = _params()
    for world in (1, 2, 3, 4):
        lay = build_layout(named, world, 25)
        seen = {n: torch.zeros(p.numel(), dtype=torch.int64) for n, p in named}
        for r in range(world):
            positions = set()
            for _, s, lo, hi, pos in lay.shard_pieces(r):
                seen[s.name][lo:hi] += 1
                assert 0 <= pos and pos + hi - lo <= lay.shard_numel
                positions.update(range(pos, pos + hi - lo))
            assert len(positions) == sum(hi - lo for *_, lo, hi, _ in lay.shard_pieces(r))
        assert all(bool((v == 1).all()) for v in seen.values())


def test_flatten_makes_params_views_and_chunks_match_pieces():
    named = _params()
    before = {n: p.detach().clone() for n, p in named}
    lay = build_layout(named, 3, 25)
    flat = flatten_into(lay, dict(named), torch.float32, "cpu")
    for n, p in named:
        assert torch.equal(p, before[n])
        assert flat.data_ptr() <= p.data_ptr() < flat.data_ptr() + flat.numel() * 4
    for r in range(3):
        shard = torch.cat(chunk_views(flat, lay, r))
        for _, s, lo, hi, pos in lay.shard_pieces(r):
            assert torch.equal(shard[pos: pos + hi - lo], before[s.name].reshape(-1)[lo:hi])


def test_reshard_between_world_sizes_round_trips():
    named = _params()
    full = {n: p.detach().reshape(-1).clone() for n, p in named}
    lay3 = build_layout(named, 3, 25)

    def shards_for(lay):
        out = []
        for r in range(lay.world_size):
            sh = torch.zeros(lay.shard_numel)
            for _, s, lo, hi, pos in lay.shard_pieces(r):
                sh[pos: pos + hi - lo] = full[s.name][lo:hi]
            out.append(sh)
        return out

    old = ParamIndex(lay3)
    shards3 = shards_for(lay3)
    for m in (1, 2, 4, 5):
        new = relayout(lay3, m)
        got = [reshard(new, r, old, shards3) for r in range(m)]
        assert all(torch.equal(a, b) for a, b in zip(got, shards_for(new)))
        idx = ParamIndex(new)
        for n in full:
            assert torch.equal(idx.gather(got, n), full[n])
            assert torch.equal(idx.gather(got, n, 2, 4), full[n][2:4]) if full[n].numel() > 4 \
                else True


def test_gathered_parameters_modifier_refreshes_fp32_masters():
    from dslaunch.config import resolve_config
    from dslaunch.engine.base.precision import build_precision
    from dslaunch.engine.comm.collectives import Comm, init_distributed
    from dslaunch.engine.zero.stage12 import Stage2Strategy
    from dslaunch.zero import GatheredParameters

    init_distributed()  # one rank, in-memory store
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    cfg = resolve_config({"train_batch_size": 1, "zero_optimization": {"stage": 2},
                          "bf16": {"enabled": True}}).typed
    strat = Stage2Strategy(model, opt, cfg.zero_optimization, Comm(),
                           build_precision(cfg.fp16, cfg.bf16))
    w = model[0].weight
    assert w.dtype == torch.bfloat16
    with GatheredParameters([w], modifier_rank=0):
        with torch.no_grad():
            w.fill_(0.5)
    model(torch.ones(1, 4, dtype=torch.bfloat16)).sum().backward()
    strat.after_backward(True)
    assert strat.step(None, None)  # lr 0: the weights become the masters again
    assert bool((model[0].weight == 0.5).all())
    strat.zero_grad()
