"""1-bit optimizers, pure logic: bit packing, config-level refusals, optimizer construction and
the single-process behaviour (no ranks to talk to: exact Adam/LAMB arithmetic)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from dslaunch.config import onebit_problems, resolve_config
from dslaunch.config.errors import ConfigError
from dslaunch.engine.optim import build_optimizer as _build_optimizer
from dslaunch.engine.optim.onebit import OneBitAdam, OneBitLamb, ZeroOneAdam
from dslaunch.engine.optim.onebit.compressed import CompressedAllReduce, pack_bits, unpack_bits


def build_optimizer(params, section: dict):
    """The engine takes the typed ``optimizer`` section (``.type``, ``.params``); these tests
    write it as a dict."""
    return _build_optimizer(params, SimpleNamespace(**section))


@pytest.mark.parametrize("n", [8, 64, 1000 * 8, 12344])
def test_pack_unpack_round_trip(n):
    g = torch.Generator().manual_seed(n)
    bits = torch.rand(n, generator=g) > 0.5
    packed = pack_bits(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == n // 8
    assert torch.equal(unpack_bits(packed), bits)


def test_pack_layout_is_little_endian_within_a_byte():
    bits = torch.zeros(16, dtype=torch.bool)
    bits[0] = True   # byte 0, bit 0
    bits[15] = True  # byte 1, bit 7
    assert pack_bits(bits).tolist() == [1, 128]
    assert pack_bits(torch.ones(8, dtype=torch.bool)).tolist() == [255]


def test_pack_needs_whole_bytes():
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_bits(torch.ones(12, dtype=torch.bool))


def test_one_rank_compression_is_sign_times_block_rms():
    """World of 1 (no process group needed): worker and server compression still run, so the
    result is the doubly-compressed value: sign(x) * rms(x) per block."""
    x = torch.tensor([3.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1.0, 0.0, 4.0, 4.0])
    car = CompressedAllReduce(x.numel(), block_size=8)
    car.rank, car.world = 0, 1  # default group absent: one rank
    y = car(x.clone())
    rms = x[:8].norm() / 8 ** 0.5
    assert torch.allclose(y[:8], torch.where(x[:8] >= 0, rms, -rms))
    assert torch.allclose(y[8:], torch.tensor([4.0, 4.0]))
    # the error buffers hold exactly what was lost
    assert torch.allclose(car.worker_error[:10] + car.server_error[:10] + y, x, atol=1e-6)


def test_config_rejects_onebit_with_zero_stage():
    cfg = {"train_micro_batch_size_per_gpu": 2,
           "optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 3}},
           "zero_optimization": {"stage": 2}}
    with pytest.raises(ConfigError) as info:
        resolve_config(cfg, world_size=2)
    assert info.value.problems == ["zero_optimization.stage: OneBitAdam works with ZeRO stage 0 "
                                   "only (the 1-bit optimizers need the whole optimizer state on "
                                   "every rank, as in DeepSpeed); got stage 2"]
    # the same rule answers for a 1-bit optimizer the user builds himself (the engine asks it)
    assert onebit_problems("OneBitAdam", 1, "none") == [
        info.value.problems[0].replace("stage 2", "stage 1")]
    assert onebit_problems("OneBitAdam", 0, "none") == []
    assert onebit_problems("AdamW", 2, "cpu") == []


@pytest.mark.parametrize("kind", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
def test_onebit_configs_resolve_without_zero(kind):
    cfg = resolve_config({"train_micro_batch_size_per_gpu": 2,
                          "optimizer": {"type": kind.lower(), "params": {"lr": 1e-3}}},
                         world_size=2)
    assert cfg.get("optimizer.type") == kind


@pytest.mark.parametrize("params, message", [
    ({"comm_backend_name": "mpi"}, "comm_backend_name: 'mpi' is not supported"),
    ({"cuda_aware": True}, "cuda_aware: true is only meaningful"),
    ({"freeze_step": 0}, "freeze_step: must be >= 1"),
    ({"amsgrad": True}, "amsgrad"),
    ({"var_freeze_step": 10}, "var_freeze_step: not a parameter of OneBitAdam"),
])
def test_bad_params_are_named(params, message):
    with pytest.raises(ValueError, match=message):
        build_optimizer(torch.nn.Linear(2, 2).parameters(),
                        {"type": "OneBitAdam", "params": params})


def test_types_and_documented_params_are_accepted():
    lin = torch.nn.Linear(2, 2)
    a = build_optimizer(lin.parameters(), {"type": "OneBitAdam", "params": {
        "lr": 1e-3, "freeze_step": 5, "cuda_aware": False, "comm_backend_name": "nccl"}})
    z = build_optimizer(lin.parameters(), {"type": "ZeroOneAdam", "params": {
        "var_freeze_step": 7, "var_update_scaler": 2, "local_step_scaler": 3,
        "local_step_clipper": 4, "comm_backend_name": "gloo"}})
    lamb = build_optimizer(lin.parameters(), {"type": "OneBitLamb", "params": {
        "freeze_step": 5, "max_coeff": 5.0, "min_coeff": 0.1, "coeff_beta": 0.8,
        "factor_max": 3.0, "factor_min": 0.6, "factor_threshold": 0.2}})
    assert isinstance(a, OneBitAdam) and a.freeze_step == 5
    assert isinstance(z, ZeroOneAdam) and (z.var_freeze_step, z.var_update_scaler,
                                           z.local_step_scaler, z.local_step_clipper) == (7, 2, 3, 4)
    assert isinstance(lamb, OneBitLamb) and (lamb.coeff_beta, lamb.factor_max, lamb.factor_min,
                                             lamb.factor_threshold) == (0.8, 3.0, 0.6, 0.2)


def _train(opt_factory, steps=12):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = opt_factory(model.parameters())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 6, generator=g), torch.randn(32, 1, generator=g)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], opt


def test_warmup_is_exact_adamw_and_lamb():
    ref, _ = _train(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01))
    got, opt = _train(lambda p: OneBitAdam(p, lr=1e-2, weight_decay=0.01, freeze_step=100))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(ref, got))
    assert not opt.in_compression_stage() and opt.wants_grad_allreduce()
    from dslaunch.engine.optim.lamb import Lamb

    ref, _ = _train(lambda p: Lamb(p, lr=1e-2))
    got, _ = _train(lambda p: OneBitLamb(p, lr=1e-2, freeze_step=100))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(ref, got))


def test_stage_switches_and_state_round_trip():
    _, opt = _train(lambda p: OneBitAdam(p, lr=1e-2, freeze_step=5), steps=5)
    assert opt.in_compression_stage() and not opt.wants_grad_allreduce()
    _, z = _train(lambda p: ZeroOneAdam(p, lr=1e-2, var_freeze_step=100, var_update_scaler=2),
                  steps=6)
    # variance updated at steps 1, 2 (interval 1), then 4, 6 (interval 2), next at 8
    assert (z.var_updates, z.var_interval) == (4, 4) and not z.wants_grad_allreduce()
    sd = z.state_dict()
    assert sd["onebit"]["extra"]["var_interval"] == 4 and sd["onebit"]["step"] == 6
    _, z2 = _train(lambda p: ZeroOneAdam(p, lr=1e-2, var_freeze_step=100, var_update_scaler=2),
                   steps=1)
    z2.load_state_dict(sd)
    assert (z2.onebit_step, z2.var_updates, z2.var_interval) == (6, 4, 4)
    with pytest.raises(ValueError, match="saved by ZeroOneAdam"):
        opt.load_state_dict(sd)


def test_sent_bytes_is_one_definition_for_every_collective():
    from dslaunch.engine.comm.collectives import sent_bytes

    n = 4096
    assert sent_bytes("all_reduce", n, 1) == 0  # one rank: nothing leaves it
    assert sent_bytes("all_reduce", n, 2) == n  # ring: 2(N-1)/N of the buffer
    assert sent_bytes("all_reduce", n, 4) == 3 * n // 2
    assert sent_bytes("onebit_all_gather", n, 4) == 3 * n  # own input to each of 3 peers
    assert sent_bytes("onebit_all_to_all", n, 4) == 3 * n // 4  # all but its own slice
    assert sent_bytes("reduce_scatter", n, 2) == n // 2
    assert sent_bytes("barrier", 0, 4) == 0


def test_compressed_path_sends_32x_fewer_bytes_than_a_ring_fp32_allreduce():
    """From the layout alone (the dist tests measure it): signs + one fp32 scale per 2048 values,
    twice (all_to_all, all_gather), against the ring all-reduce of 4-byte values."""
    from dslaunch.engine.comm.collectives import sent_bytes

    chunk = 2048 * 64  # values per rank: whole blocks, no padding
    per_rank = chunk // 8 + 4 * (chunk // 2048)  # packed signs + scales
    for world in (2, 4, 8):
        sent = sent_bytes("onebit_all_to_all", per_rank * world, world) + sent_bytes(
            "onebit_all_gather", per_rank, world)
        ratio = sent_bytes("all_reduce", 4 * chunk * world, world) / sent
        assert ratio == pytest.approx(32 / (1 + 32 / 2048), rel=1e-3), (world, ratio)


def test_never_seen_coordinates_keep_zero_momentum():
    m = torch.tensor([0.5, -0.25, 0.125, 1.0])
    v = torch.tensor([0.0, 1e-12, 0.0, 2.0])
    OneBitAdam.mask_unseen(m, v)
    assert m.tolist() == [0.0, -0.25, 0.0, 1.0]


# -- the compiled op onebit_pack equals the torch kernels -----------------------------------------

def _compiled_kernels():
    from dslaunch.engine.optim.onebit import compressed
    from dslaunch.kernels import builder

    return compressed._Compiled(builder.load("onebit_pack"))


# (values, block, blocks per row, rows): padding inside a block, whole padding blocks, odd sign
# bytes per row (scales not 4-byte aligned), one row (the server side)
@pytest.mark.parametrize("n, block, row_blocks, rows", [
    (37, 40, 1, 1), (4099, 64, 33, 2), (5000, 8, 313, 2), (1000, 24, 11, 4), (300_001, 2048, 74, 2)])
def test_compiled_pack_and_decode_equal_torch(n, block, row_blocks, rows):
    from dslaunch.engine.optim.onebit.compressed import decode_torch, pack_torch

    ops = _compiled_kernels()
    g = torch.Generator().manual_seed(n)
    padded = rows * row_blocks * block
    n_valid = min(n, padded)
    x = torch.randn(n, generator=g)
    x[:5] = 0.0  # sign of 0 is +1 in both
    err0 = torch.zeros(padded)
    err0[:n_valid] = 0.1 * torch.randn(n_valid, generator=g)
    row_bytes = row_blocks * block // 8 + 4 * row_blocks
    sign_bytes = row_blocks * block // 8
    wire = {}
    for name, pack in (("compiled", ops.pack), ("torch", pack_torch)):
        err, out = err0.clone(), torch.full((rows * row_bytes,), 7, dtype=torch.uint8)
        pack(x, err, n_valid, block, row_blocks, out)
        wire[name] = (out.view(rows, row_bytes), err)
    (a, ea), (b, eb) = wire["compiled"], wire["torch"]
    assert torch.equal(a[:, :sign_bytes], b[:, :sign_bytes])  # signs: bit for bit
    sa = a[:, sign_bytes:].reshape(-1).clone().view(torch.float32)
    sb = b[:, sign_bytes:].reshape(-1).clone().view(torch.float32)
    torch.testing.assert_close(sa, sb, rtol=1e-6, atol=0)  # norms summed in another order
    torch.testing.assert_close(ea, eb, rtol=0, atol=1e-6 * sb.abs().max().item())
    assert not ea[n_valid:].any()  # padding carries no error
    # decode: the torch wire into both decoders, summed over rows and laid out row after row
    for sum_rows, n_out in ((True, row_blocks * block - 3), (False, n_valid)):
        outs = [torch.full((padded,), 7.0) for _ in range(2)]
        ops.decode(b.reshape(-1), rows, row_blocks, block, outs[0], n_out, 1 / rows, sum_rows)
        decode_torch(b.reshape(-1), rows, row_blocks, block, outs[1], n_out, 1 / rows, sum_rows)
        assert torch.equal(outs[0], outs[1]), sum_rows
        assert outs[0][n_out:].eq(7.0).all()  # nothing written past n_out


def test_compiled_clamp_equals_torch():
    from dslaunch.engine.optim.onebit.optimizer import OneBitOptimizer, clamp_torch

    g = torch.Generator().manual_seed(3)
    m = torch.randn(70_001, generator=g)
    denom = torch.rand(70_001, generator=g) * 0.1 + 1e-8
    denom[::7] = float("inf")  # never-seen coordinates: momentum forced to 0
    ref = clamp_torch(m.clone(), denom, 3.0)
    got = OneBitOptimizer.clamp_to_adam(m.clone(), denom, 3.0)
    assert torch.equal(got, ref)
    assert got[::7].eq(0).all() and ((got / denom).abs() <= 3.0 * (1 + 1e-6)).all()
    assert (ref != m).any()  # the bound did cut some


def test_compressed_allreduce_compiled_equals_torch_over_calls():
    """One rank (no group needed): worker and server compression run; ten calls let the error
    buffers of both implementations evolve side by side."""
    n = 10_007
    cars = [CompressedAllReduce(n, block_size=256, use_compiled=c) for c in (True, False)]
    assert [c.compiled for c in cars] == [True, False]
    g = torch.Generator().manual_seed(5)
    for _ in range(10):
        x = torch.randn(n, generator=g)
        a, b = cars[0](x.clone()), cars[1](x.clone())
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cars[0].worker_error, cars[1].worker_error, rtol=0, atol=1e-5)
    torch.testing.assert_close(cars[0].server_error, cars[1].server_error, rtol=0, atol=1e-5)
    y = torch.randn(n, generator=g).double()  # another dtype: converted, result written back
    out = cars[0](y)
    assert out is y and out.dtype == torch.float64


def test_onebit_adam_compression_stage_uses_the_frozen_variance():
    """One rank (nothing to compress): after freeze_step every step is Adam with the variance of
    step freeze_step, the momentum clamped to Adam's bound, from one flat momentum buffer; the
    same after a state_dict round trip (the buffer and the denominator are rebuilt)."""
    freeze, lr = 4, 1e-2
    _, opt = _train(lambda p: OneBitAdam(p, lr=lr, freeze_step=freeze), steps=freeze)
    params = opt.all_params()
    v = [opt.state[p]["exp_avg_sq"].clone() for p in params]
    m = [opt.state[p]["exp_avg"].clone() for p in params]
    x = [p.detach().clone() for p in params]
    g = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) for i, p in
         enumerate(params)]
    sd = copy.deepcopy(opt.state_dict())  # the state holds the live tensors
    bound = OneBitAdam.adam_bound(0.9, 0.999)
    for t in (freeze + 1, freeze + 2):
        bc1 = 1 - 0.9 ** t
        for i, p in enumerate(params):
            p.grad = g[i].clone()
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            denom = v[i].sqrt() / (1 - 0.999 ** freeze) ** 0.5 + 1e-8
            m[i] = torch.maximum(torch.minimum(m[i], denom * bound * bc1), -denom * bound * bc1)
            x[i] = x[i] - lr / bc1 * m[i] / denom
        opt.step()
    for i, p in enumerate(params):
        torch.testing.assert_close(p.detach(), x[i], rtol=1e-5, atol=1e-7)
        assert torch.equal(opt.state[p]["exp_avg_sq"], v[i])  # frozen
    flat = opt._flat_m
    assert all(opt.state[p]["exp_avg"].data_ptr() == flat[o:].data_ptr() for p, o in
               zip(params, [0, 48, 56, 64]))  # Linear(6,8), bias 8, Linear(8,1), bias 1
    _, again = _train(lambda p: OneBitAdam(p, lr=lr, freeze_step=freeze), steps=freeze)
    again.load_state_dict(sd)
    for i, p in enumerate(again.all_params()):
        p.grad = g[i].clone()
    again.step()
    for i, p in enumerate(again.all_params()):
        p.grad = g[i].clone()
    again.step()
    for a, b in zip(again.all_params(), params):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0)


def test_zero_one_adam_local_steps_never_move_unseen_coordinates():
    """Phase 2 (frozen variance, local steps): a coordinate with no gradient on any variance
    step (variance exactly 0) stays put on a local step, as under 1-bit Adam; it used to step
    by lr * m / eps (~4e5 here) until the next sync put it back. A seen coordinate takes Adam's
    step with the frozen variance (one rank: the syncs average nothing)."""
    w = torch.nn.Parameter(torch.zeros(2))
    lr = 1e-2
    opt = ZeroOneAdam([w], lr=lr, var_freeze_step=1, local_step_scaler=1, local_step_clipper=2)

    def step(g):
        w.grad = torch.tensor(g)
        opt.step()

    step([1.0, 0.0])  # t=1: variance step; coordinate 1 never seen
    step([1.0, 0.0])  # t=2: phase 2, sync every step, then every 2 steps
    assert opt.local_step_interval == 2
    before = w.detach().clone()
    step([1.0, 1.0])  # t=3: a local step only
    assert w[1].item() == 0.0
    # m_hat = 1 after three unit gradients; v_hat = 1 (frozen at t=1): the step is lr
    assert (before[0] - w[0]).item() == pytest.approx(lr, rel=1e-5)
    step([1.0, 1.0])  # t=4: local step and sync
    assert w[1].item() == 0.0 and torch.isfinite(w).all()
    assert (before[0] - w[0]).item() == pytest.approx(2 * lr, rel=1e-5)
    assert opt.state[w]["exp_avg"][1].item() == 0.0


@pytest.mark.parametrize("compiled", [True, False])
def test_segments_compress_each_parameter_on_its_own(compiled):
    """With ``segments`` (the optimizers pass their parameters' sizes) no scale spans two
    segments: the result and the error buffers equal one compressor per segment, call after
    call (one rank here; 2 and 3 ranks were checked the same way against per-segment
    compressors). A bias with 10x the gradients of its neighbour keeps its own magnitude."""
    sizes = [37, 2048, 64, 3000, 8, 3]
    seg = CompressedAllReduce(sum(sizes), segments=sizes, use_compiled=compiled)
    alone = [CompressedAllReduce(n, use_compiled=compiled) for n in sizes]
    assert seg.row_bytes == sum(c.row_bytes for c in alone)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(sum(sizes), generator=g)
        x[37 + 2048:37 + 2048 + 64] *= 10  # the "bias" after a "matrix"
        got = seg(x.clone())
        want = torch.cat([c(part.clone()) for c, part in zip(alone, x.split(sizes))])
        assert torch.equal(got, want)
    bias = got[37 + 2048:37 + 2048 + 64].abs()
    assert torch.allclose(bias, bias[0].expand(64)) and bias[0] > 5 * got[37:37 + 2048].abs().max()
    with pytest.raises(ValueError, match="segments"):
        CompressedAllReduce(10, segments=[4, 5])
    sd = seg.state_dict()
    assert CompressedAllReduce(sum(sizes), segments=sizes).load_state_dict(sd)
    assert not CompressedAllReduce(sum(sizes)).load_state_dict(sd)  # another layout: reset
