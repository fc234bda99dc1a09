"""dslaunch.sequence.tiled: TiledMLP and TiledFusedLogitsLoss (DeepSpeed 0.19's call signatures)
against the same computation untiled, in-process.

Tolerances: fp64 relative 1e-12 (the tiles' weight gradients are sums of per-tile products, in
another order than one big product), fp32 relative 1e-5; the input gradient of TiledMLP and the
loss value are compared the same way. Also: an uneven last tile, a gradient scale above the node
(loss * 0.37: exact, not only at 1), gradient hooks firing once per weight and backward, the
forward of TiledMLP saving only its input, the logits existing one tile at a time, masks,
"mean" and "sum", no backward work under no_grad, and the argument checks.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dslaunch.sequence.tiled import TiledFusedLogitsLoss, TiledMLP

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def close(a, b, dtype):
    return torch.allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype] * b.abs().max().item())


class SwiGLU(nn.Module):  # Llama's MLP
    def __init__(self, d):
        super().__init__()
        self.gate = nn.Linear(d, 3 * d, bias=False)
        self.up = nn.Linear(d, 3 * d, bias=False)
        self.down = nn.Linear(3 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def mlp_forward(self, x):
    return SwiGLU.forward(self, x)


def _grads(module, x, out, scale):
    for p in [x, *module.parameters()]:
        p.grad = None
    ((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() * scale).backward()
    return [x.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(2, 37, 16), (37, 16)])  # [b, s, h] and [s, h] (MoE experts)
def test_tiled_mlp_equals_untiled(dtype, shape):
    torch.manual_seed(0)
    mlp = SwiGLU(16).to(dtype)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    ref = mlp(x)
    ref_grads = _grads(mlp, x, ref, 0.37)
    fired = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p: fired.__setitem__(id(p), fired.get(id(p), 0) + 1))
             for p in mlp.parameters()]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
        out = TiledMLP.apply(mlp_forward, mlp, x, 4, [mlp.gate.weight, mlp.up.weight, mlp.down.weight])
    assert saved == [x.numel() * x.element_size()]  # the forward keeps its input only
    grads = _grads(mlp, x, out, 0.37)
    for h in hooks:
        h.remove()
    assert close(out, ref, dtype)
    assert all(close(g, r, dtype) for g, r in zip(grads, ref_grads))
    assert sorted(fired.values()) == [1, 1, 1]  # each weight's gradient arrives once


def test_tiled_mlp_weights_found_on_the_module_and_frozen_ones_skipped():
    torch.manual_seed(0)
    mlp = SwiGLU(8).double()
    mlp.up.weight.requires_grad_(False)
    x = torch.randn(3, 10, 8, dtype=torch.float64, requires_grad=True)
    ref_grads = _grads(mlp, x, mlp(x), 1.0)
    grads = _grads(mlp, x, TiledMLP.apply(mlp_forward, mlp, x, 3, None), 1.0)
    assert mlp.up.weight.grad is None
    assert all((g is None and r is None) or close(g, r, torch.float64)
               for g, r in zip(grads, ref_grads))


class Head(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.lm_head = nn.Linear(d, vocab, bias=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tiled_logits_loss_equals_untiled(dtype):
    torch.manual_seed(0)
    model = Head(16, 50).to(dtype)
    x = torch.randn(2, 29, 16, dtype=dtype, requires_grad=True)  # 58 rows in 4 tiles: 15,15,15,13
    y = torch.randint(0, 50, (2, 29))
    y[0, :5] = -100  # ignored positions
    n_valid = (y != -100).sum()
    logit_rows = []

    def loss_fn(self, x_tile, y_tile):  # the tile's share of the mean over all valid tokens
        logits = self.lm_head(x_tile)
        logit_rows.append(logits.shape[0])
        return F.cross_entropy(logits, y_tile, ignore_index=-100, reduction="sum") / n_valid

    ref = F.cross_entropy(model.lm_head(x).view(-1, 50), y.view(-1), ignore_index=-100)
    (ref * 0.37).backward()
    ref_grads = [x.grad.clone(), model.lm_head.weight.grad.clone()]
    x.grad = model.lm_head.weight.grad = None
    loss = TiledFusedLogitsLoss.apply(loss_fn, model, x, y, None, 4, [model.lm_head.weight], "sum")
    assert logit_rows == [15, 15, 15, 13]  # never all 58 rows of logits at once
    (loss * 0.37).backward()
    assert close(loss, ref, dtype)
    assert close(x.grad, ref_grads[0], dtype) and close(model.lm_head.weight.grad, ref_grads[1], dtype)


def test_tiled_logits_loss_mean_mask_and_no_grad():
    torch.manual_seed(1)
    model = Head(8, 20).double()
    model.unused = nn.Linear(2, 2)  # a weight of self that fn does not read: no gradient
    x = torch.randn(2, 12, 8, dtype=torch.float64, requires_grad=True)  # 24 rows, 3 even tiles
    y = torch.randint(0, 20, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    seen = []

    def loss_fn(self, x_tile, y_tile, mask_tile):
        seen.append((mask_tile.shape, torch.is_grad_enabled()))
        return F.cross_entropy(self.lm_head(x_tile), y_tile)

    loss = TiledFusedLogitsLoss.apply(loss_fn, model, x, y, mask, 3, None, "mean")
    loss.backward()
    ref_x = x.detach().clone().requires_grad_(True)
    weight = model.lm_head.weight.grad.clone()
    model.lm_head.weight.grad = None
    ref = F.cross_entropy(model.lm_head(ref_x).view(-1, 20), y.view(-1))
    ref.backward()
    assert seen == [(torch.Size([8]), True)] * 3 and model.unused.weight.grad is None
    assert close(loss, ref, torch.float64) and close(x.grad, ref_x.grad, torch.float64)
    assert close(weight, model.lm_head.weight.grad, torch.float64)
    with torch.no_grad():  # evaluation: the loss only
        again = TiledFusedLogitsLoss.apply(loss_fn, model, x, y, mask, 3, [model.lm_head.weight],
                                           "mean")
    assert not again.requires_grad and close(again, ref, torch.float64)
    assert seen[3:] == [(torch.Size([8]), False)] * 3  # no backward work
    with pytest.raises(ValueError, match="unknown reduction"):
        TiledFusedLogitsLoss.apply(loss_fn, model, x, y, mask, 3, [], "max")
    with pytest.raises(ValueError, match="batch/seq dims must match"):
        TiledFusedLogitsLoss.apply(loss_fn, model, x, y[:, :5], None, 3, [], "mean")


def test_example_gpt_with_checkpointing_and_tiling_equals_plain():
    """examples/gpt.py's use_long_sequence with dslaunch's functions: checkpointing alone is
    bit-identical (dropout on); with tiled MLP and tiled logits + loss too, fp32 1e-5."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import dslaunch
    from gpt import GPT, GPTConfig

    def loss_and_grads(model, tok, tgt):
        torch.manual_seed(3)
        model.zero_grad()
        loss = model(tok, tgt)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, seq_len=24, n_layer=2, n_head=2, d_model=16, dropout=0.1))
    tok, tgt = torch.randint(0, 64, (2, 24)), torch.randint(0, 64, (2, 24))
    plain = loss_and_grads(model, tok, tgt)
    model.use_long_sequence(checkpoint=dslaunch.checkpointing.checkpoint)
    ckpt = loss_and_grads(model, tok, tgt)
    assert torch.equal(plain[0], ckpt[0]) and all(torch.equal(a, b) for a, b in zip(plain[1], ckpt[1]))
    model.use_long_sequence(checkpoint=dslaunch.checkpointing.checkpoint, tiled_mlp=TiledMLP,
                            mlp_tiles=5, tiled_loss=TiledFusedLogitsLoss, loss_tiles=7)
    tiled = loss_and_grads(model, tok, tgt)
    assert close(tiled[0], plain[0], torch.float32)
    assert all(close(a, b, torch.float32) for a, b in zip(tiled[1], plain[1]))
