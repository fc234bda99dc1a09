"""``dslaunch.zero.TiledLinear`` (dslaunch/engine/zero/tiled_linear.py) against ``nn.Linear``
with the same weights: forward and backward (input gradient, and each tile's weight / bias
gradient = its block of nn.Linear's), even and uneven tiles, the split-input / split-output
forms; under a ZeRO-3 engine each tile is its own gather unit and training equals the plain
Linear's."""

import pytest
import torch

import dslaunch
from dslaunch.zero import TiledLinear


@pytest.mark.parametrize("in_f,out_f,in_s,out_s,bias", [
    (12, 8, 1, 1, True), (10, 7, 3, 4, True), (16, 9, 4, 2, False), (5, 5, 5, 5, True)])
def test_tiles_compute_what_the_linear_computes(in_f, out_f, in_s, out_s, bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(in_f, out_f, bias=bias).double()
    tiled = TiledLinear(in_f, out_f, bias=bias, in_splits=in_s, out_splits=out_s,
                        init_linear=ref).double()
    assert len(tiled.linears) == out_s and all(len(row) == in_s for row in tiled.linears)
    x = torch.randn(3, 2, in_f, dtype=torch.double, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.testing.assert_close(tiled(x), ref(x2), rtol=0, atol=1e-12)
    g = torch.randn(3, 2, out_f, dtype=torch.double)
    tiled(x).backward(g)
    ref(x2).backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=1e-12)
    for o, row in enumerate(tiled.linears):
        r0, r1 = tiled.out_parts[o], tiled.out_parts[o + 1]
        for i, tile in enumerate(row):
            c0, c1 = tiled.in_parts[i], tiled.in_parts[i + 1]
            torch.testing.assert_close(tile.weight.grad, ref.weight.grad[r0:r1, c0:c1],
                                       rtol=0, atol=1e-12)
            assert (tile.bias is not None) == (bias and i == in_s - 1)  # one bias per row
            if tile.bias is not None:
                torch.testing.assert_close(tile.bias.grad, ref.bias.grad[r0:r1], rtol=0,
                                           atol=1e-12)
    assert sum(p.numel() for p in tiled.parameters()) == sum(p.numel() for p in ref.parameters())


def test_split_input_split_output_and_bad_splits():
    torch.manual_seed(0)
    ref = torch.nn.Linear(7, 5)
    tiled = TiledLinear(7, 5, in_splits=2, out_splits=2, input_is_already_split=True,
                        combine_out_splits=False, init_linear=ref)
    assert tiled.in_parts == [0, 4, 7] and tiled.out_parts == [0, 3, 5]  # larger blocks first
    x = torch.randn(4, 7)
    outs = tiled([x[:, :4], x[:, 4:]])
    assert [o.shape[-1] for o in outs] == [3, 2]
    torch.testing.assert_close(torch.cat(outs, -1), ref(x))
    with pytest.raises(RuntimeError, match=r"in_splits=8 must be in \[1, in_features=7\]"):
        TiledLinear(7, 5, in_splits=8)
    with pytest.raises(RuntimeError, match="out_splits=0"):
        TiledLinear(7, 5, out_splits=0)
    with pytest.raises(ValueError, match="weight shape"):
        tiled.copy_params_from(torch.nn.Linear(5, 7))


def _train(layer_cls, stage):
    torch.manual_seed(0)
    ref, head = torch.nn.Linear(24, 12), torch.nn.Linear(12, 1)
    layer = ref if layer_cls is torch.nn.Linear else \
        TiledLinear(24, 12, in_splits=3, out_splits=2, init_linear=ref)
    model = torch.nn.Sequential(layer, torch.nn.Tanh(), head)
    engine, *_ = dslaunch.initialize(model=model, config={
        "train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}})
    losses = []
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        loss = engine(torch.randn(4, 24, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


def test_under_zero3_each_tile_is_gathered_alone_and_trains_as_the_linear():
    engine, tiled = _train(TiledLinear, 3)
    units = engine.strategy.plan.fetch
    tiles = [t for row in engine.module[0].linears for t in row]
    assert len(tiles) == 6 and all(t in units for t in tiles)
    assert all(len(units[t]) == 1 for t in tiles)  # one bucket each: gathered one at a time
    _, plain = _train(torch.nn.Linear, 3)
    torch.testing.assert_close(tiled, plain, rtol=1e-5, atol=1e-6)
