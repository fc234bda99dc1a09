"""Sparse attention (issue 34 part 4): DeepSpeed 0.18's layouts, exactly; attention on the kept
blocks equal to dense attention under the layout's mask, forward and backward, fp32 and bf16."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import dslaunch.engine.features.sparse_attention.block_attention as block_attention
from dslaunch.engine.features.sparse_attention.block_attention import (
    BlockTable,
    block_sparse_attention,
    layout_to_token_mask,
)
from dslaunch.engine.features.sparse_attention.modules import sparsity_config_from_dict
from dslaunch.ops import sparse_attention as sa

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests/fixtures/sparse_layouts_ds0189.json").read_text())


@pytest.mark.parametrize("case", FIXTURE["cases"],
                         ids=[f"{i}-{c['class']}" for i, c in enumerate(FIXTURE["cases"])])
def test_layout_equals_deepspeed_0_18(case):
    """make_layout == DeepSpeed 0.18.9's (tests/fixtures/sparse_layouts_peer.py wrote the
    fixture), random blocks included under the same random.seed."""
    random.seed(case["seed"])
    layout = getattr(sa, case["class"])(**case["kwargs"]).make_layout(case["seq_len"])
    assert layout.dtype == torch.int64
    rows = [["".join(str(v) for v in row) for row in head] for head in layout.tolist()]
    assert rows == case["layout"]


def test_layout_errors():
    with pytest.raises(ValueError, match="multiple of the block"):
        sa.FixedSparsityConfig(2, block=16).make_layout(100)
    with pytest.raises(ValueError, match="num_local_blocks 5"):
        sa.FixedSparsityConfig(2, num_local_blocks=5, num_global_blocks=2)
    with pytest.raises(ValueError, match="horizontal"):
        sa.FixedSparsityConfig(2, attention="unidirectional", horizontal_global_attention=True)
    with pytest.raises(ValueError, match="different_layout_per_head"):
        sa.FixedSparsityConfig(2, num_different_global_patterns=2)
    with pytest.raises(NotImplementedError):
        sa.VariableSparsityConfig(2, attention="causal")
    with pytest.raises(ValueError, match="pair up"):
        sa.BSLongformerSparsityConfig(2, global_block_indices=[0, 4], global_block_end_indices=[2])
    with pytest.raises(NotImplementedError):
        sa.SparsityConfig(2).make_layout(64)


def _dense(q, k, v, token_mask, scale, kpm=None, attn_mask=None, rpe=None):
    """Reference: dense attention in fp32 with every pair outside the kept blocks masked."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if rpe is not None:
        s = s + rpe
    if kpm is not None:
        s = s + kpm[:, None, None, :]
    if attn_mask is not None:
        s = s.masked_fill(attn_mask == 0, float("-inf"))
    s = s.masked_fill(~token_mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v.float())


LAYOUTS = {
    "fixed": lambda h, b: sa.FixedSparsityConfig(h, block=b, num_local_blocks=4),
    "fixed_per_head": lambda h, b: sa.FixedSparsityConfig(
        h, block=b, different_layout_per_head=True, num_different_global_patterns=2,
        horizontal_global_attention=True),
    "variable": lambda h, b: sa.VariableSparsityConfig(
        h, block=b, different_layout_per_head=True, num_random_blocks=1,
        local_window_blocks=[2, 3], global_block_indices=[1]),
    "bigbird": lambda h, b: sa.BigBirdSparsityConfig(h, block=b, different_layout_per_head=True),
    "bslongformer": lambda h, b: sa.BSLongformerSparsityConfig(h, block=b),
    "local": lambda h, b: sa.LocalSlidingWindowSparsityConfig(h, block=b,
                                                              attention="bidirectional"),
    "dense": lambda h, b: sa.DenseSparsityConfig(h, block=b),
}


def _inputs(B, H, L, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("name", list(LAYOUTS))
# one chunk, rows grouped as the table chooses; many chunks of 1, 2 or 4 block rows per group
@pytest.mark.parametrize("chunk,group", [(1 << 24, None), (700, 1), (2000, 2), (3000, 4)])
def test_equals_dense_with_layout_mask_fp32(name, chunk, group, monkeypatch):
    monkeypatch.setattr(block_attention, "CHUNK_ELEMENTS", chunk)
    random.seed(1)
    B, H, L, D, block = 2, 3, 96, 16, 8
    layout = LAYOUTS[name](H, block).make_layout(L)
    q, k, v = _inputs(B, H, L, D, torch.float32)
    kpm = torch.zeros(B, L)
    kpm[1, -7:] = -10000.0  # padding of the second sample, DeepSpeed's additive form
    rpe = 0.1 * torch.randn(1, H, L, L, generator=torch.Generator().manual_seed(3))
    table = BlockTable(layout, block, group)
    out = block_sparse_attention(q, k, v, table, block, rpe=rpe, key_padding_mask=kpm)
    ref = _dense(q, k, v, layout_to_token_mask(layout, block), D ** -0.5, kpm=kpm, rpe=rpe)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fixed", "bigbird"])
def test_equals_dense_bf16(name):
    """bf16 inputs: computed in fp32 inside, the output and gradients rounded to bf16."""
    random.seed(2)
    B, H, L, D, block = 1, 2, 128, 32, 16
    layout = LAYOUTS[name](H, block).make_layout(L)
    q, k, v = _inputs(B, H, L, D, torch.bfloat16)
    out = block_sparse_attention(q, k, v, layout, block)
    assert out.dtype == torch.bfloat16
    ref = _dense(q, k, v, layout_to_token_mask(layout, block), D ** -0.5)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad(out, (q, k, v), grad.to(torch.bfloat16))
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("name", ["fixed", "bigbird", "bslongformer", "local"])
def test_unidirectional_with_causal_mask(name):
    """'unidirectional' layouts keep the lower block triangle; token-level causality inside
    the diagonal blocks is DeepSpeed's attn_mask (mode 'mul': its zeros are masked)."""
    random.seed(4)
    B, H, L, D, block = 2, 2, 80, 8, 8
    make = {"fixed": sa.FixedSparsityConfig, "bigbird": sa.BigBirdSparsityConfig,
            "bslongformer": sa.BSLongformerSparsityConfig,
            "local": sa.LocalSlidingWindowSparsityConfig}[name]
    layout = make(H, block=block, attention="unidirectional").make_layout(L)
    assert torch.equal(layout, torch.tril(layout))
    causal = torch.tril(torch.ones(L, L))
    assert BlockTable(layout, block, 2).group == 2
    module = sa.SparseSelfAttention(make(H, block=block, attention="unidirectional"),
                                    max_seq_length=L)
    module.master_layout.copy_(layout)  # the random blocks of the layout checked above
    q, k, v = _inputs(B, H, L, D, torch.float32, seed=7)
    out = module(q, k, v, attn_mask=causal)
    ref = _dense(q, k, v, layout_to_token_mask(layout, block), D ** -0.5, attn_mask=causal)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # no query sees a later key: changing the last token changes no earlier output
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, -1] += 1.0
    v2[:, :, -1] += 1.0
    out2 = module(q, k2, v2, attn_mask=causal)
    torch.testing.assert_close(out2[:, :, :-1], out[:, :, :-1])


def test_module_masks_shorter_input_and_transposed_key():
    """SparseSelfAttention as DeepSpeed's: a [batch, 1, 1, seq] additive key-padding mask, a
    shorter sequence using the top-left corner of master_layout, key given [B, H, D, L]."""
    random.seed(0)
    H, block, D = 2, 8, 8
    cfg = sa.VariableSparsityConfig(H, block=block, num_random_blocks=1)
    module = sa.SparseSelfAttention(cfg, max_seq_length=128)
    assert module.master_layout.shape == (H, 16, 16)
    L = 64
    q, k, v = _inputs(2, H, L, D, torch.float32, seed=9)
    kpm = torch.zeros(2, 1, 1, L)
    kpm[0, ..., -5:] = -10000.0
    out = module(q, k.transpose(-1, -2), v, key_padding_mask=kpm)
    layout = module.master_layout[:, :8, :8]
    ref = _dense(q, k, v, layout_to_token_mask(layout, block), D ** -0.5, kpm=kpm.view(2, L))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of the block"):
        module(q[:, :, :60], k[:, :, :60], v[:, :, :60])
    with pytest.raises(ValueError, match="max_seq_length"):
        module(*_inputs(1, H, 256, D, torch.float32))


def test_bert_sparse_self_attention_and_utils():
    torch.manual_seed(0)
    config = SimpleNamespace(hidden_size=32, num_attention_heads=4)
    layer = sa.BertSparseSelfAttention(config, sa.FixedSparsityConfig(4, block=8))
    hidden = torch.randn(2, 48, 32)
    mask = torch.zeros(2, 1, 1, 48)
    out = layer(hidden, mask)
    assert out.shape == (2, 48, 32)
    split = lambda x: x.view(2, 48, 4, 8).permute(0, 2, 1, 3)
    ref = _dense(split(layer.query(hidden)), split(layer.key(hidden)), split(layer.value(hidden)),
                 layout_to_token_mask(layer.sparse_self_attention.get_layout(48), 8), 8 ** -0.5)
    torch.testing.assert_close(out, ref.permute(0, 2, 1, 3).reshape(2, 48, 32),
                               rtol=1e-5, atol=1e-5)
    ids = torch.ones(2, 45, dtype=torch.long)
    pad, ids2, am, tt, pos, emb = sa.SparseAttentionUtils.pad_to_block_size(
        16, ids, torch.ones(2, 45), torch.zeros(2, 45, dtype=torch.long), None, None, 0, None)
    assert pad == 3 and ids2.shape == (2, 48) and am[:, -3:].eq(0).all() and tt.shape == (2, 48)
    assert sa.SparseAttentionUtils.unpad_sequence_output(pad, torch.zeros(2, 48, 5)).shape[1] == 45


@pytest.mark.parametrize("section,cls,kwargs", [
    ({"mode": "dense", "block": 8}, sa.DenseSparsityConfig, {"block": 8}),
    ({}, sa.FixedSparsityConfig, {}),
    ({"mode": "fixed", "num_local_blocks": 8, "attention": "unidirectional"},
     sa.FixedSparsityConfig, {"num_local_blocks": 8, "attention": "unidirectional"}),
    ({"mode": "variable", "num_random_blocks": 2, "local_window_blocks": [2, 4],
      "global_block_indices": [0, 3], "global_block_end_indices": [1, 5]},
     sa.VariableSparsityConfig, {"num_random_blocks": 2, "local_window_blocks": [2, 4],
                                 "global_block_indices": [0, 3],
                                 "global_block_end_indices": [1, 5]}),
    # the config's num_random_blocks default is 0 (DeepSpeed's config), the class's 1
    ({"mode": "bigbird"}, sa.BigBirdSparsityConfig, {"num_random_blocks": 0}),
    ({"mode": "bslongformer", "num_sliding_window_blocks": 5}, sa.BSLongformerSparsityConfig,
     {"num_sliding_window_blocks": 5}),
    ({"mode": "local"}, sa.LocalSlidingWindowSparsityConfig, {}),
])
def test_config_section_builds_the_layout(section, cls, kwargs):
    got = sparsity_config_from_dict(section, 4)
    assert type(got) is cls
    random.seed(0)
    got_layout = got.make_layout(256)
    random.seed(0)
    assert torch.equal(got_layout, cls(4, **kwargs).make_layout(256))


def test_config_example_and_face():
    from dslaunch.config import resolve_config

    cfg = resolve_config(str(ROOT / "configs/sparse_attention_fixed.json"), world_size=2)
    section = cfg.get("sparse_attention")
    layout = sparsity_config_from_dict(section, 4).make_layout(1024)
    assert layout.shape == (4, 64, 64) and not torch.equal(layout[0], layout[1])
    assert torch.equal(layout, torch.tril(layout))
    import dslaunch.ops

    assert dslaunch.ops.sparse_attention.SparseSelfAttention is sa.SparseSelfAttention
    with pytest.raises(AttributeError, match="deepspeed.ops.sparse_attention.matmul"):
        sa.matmul  # noqa: B018


@pytest.mark.parametrize("name", ["fixed", "variable", "bigbird", "local"])
@pytest.mark.parametrize("mask", [None, "key_padding", "causal"])
def test_compiled_equals_torch_path(name, mask, monkeypatch):
    """The compiled CPU op (cpp/cpu/block_sparse_attn.cpp; CPU tensors without rpe) gives the
    torch path's output and gradients, with DeepSpeed's key-padding ('add') and attention
    ('mul') masks too."""
    from dslaunch.kernels import load_op

    if load_op("cpu_block_sparse_attn") is None:
        pytest.skip("the compiled op cannot be built here")
    random.seed(3)
    B, H, L, D, block = 2, 3, 128, 16, 8
    layout = LAYOUTS[name](H, block).make_layout(L)
    q, k, v = _inputs(B, H, L, D, torch.float32, seed=11)
    kpm = am = None
    if mask == "key_padding":
        kpm = torch.zeros(B, L)
        kpm[1, -9:] = -10000.0
    if mask == "causal":
        am = torch.tril(torch.ones(L, L))
    grad = torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(12))
    results = []
    for compiled in (False, True):
        monkeypatch.setattr(block_attention, "USE_COMPILED", compiled)
        out = block_sparse_attention(q, k, v, layout, block, key_padding_mask=kpm, attn_mask=am)
        results.append((out, torch.autograd.grad(out, (q, k, v), grad)))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ref = _dense(q, k, v, layout_to_token_mask(layout, block), D ** -0.5, kpm=kpm, attn_mask=am)
    if mask == "causal":  # a row whose kept keys are all later gets 0 here, NaN in dense
        ref = torch.nan_to_num(ref)
    torch.testing.assert_close(results[1][0], ref, rtol=1e-5, atol=1e-5)


def test_trains_through_the_engine_with_the_config_section():
    """A model builds its layout from the config's sparse_attention section (as DeepSpeed's
    BERT example reads it) and trains under dslaunch.initialize with that config: bf16, the
    engine hands the section back in engine.config, the loss falls."""
    import dslaunch
    from dslaunch.config import load_config

    config = load_config(ROOT / "configs/sparse_attention_fixed.json")
    torch.manual_seed(0)
    random.seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 32)
            layout = sparsity_config_from_dict(config["sparse_attention"], 4)
            self.attn = sa.BertSparseSelfAttention(SimpleNamespace(hidden_size=32,
                                                                   num_attention_heads=4),
                                                   layout)
            self.head = torch.nn.Linear(32, 32)

        def forward(self, ids):
            causal = torch.tril(torch.ones(ids.shape[1], ids.shape[1]))
            h = self.embed(ids)
            q, k, v = (self.attn.transpose_for_scores(f(h))
                       for f in (self.attn.query, self.attn.key, self.attn.value))
            ctx = self.attn.sparse_self_attention(q, k, v, attn_mask=causal)
            ctx = ctx.permute(0, 2, 1, 3).reshape(h.shape)
            logits = self.head(h + ctx)[:, :-1]
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 32).float(),
                                                     ids[:, 1:].reshape(-1))

    engine, *_ = dslaunch.initialize(model=Tiny(), config=dict(config))
    assert engine.config["sparse_attention"]["num_local_blocks"] == 8
    ids = torch.randint(0, 32, (2, 128), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(8):
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
