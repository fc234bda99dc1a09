"""The FLOPs profiler (``dslaunch.profiling.flops_profiler``, DeepSpeed's API), in process:
MACs and parameters exact against hand counts for Linear, Conv (grouped, strided, transposed)
and attention models, whether the model calls modules, functionals, ``@`` or
``F.scaled_dot_product_attention``; the FlopsProfiler lifecycle; the engine's profiled step on the
example GPT (forward FLOPs x 3 within 2% of 6 x non-embedding params x tokens + attention) and
the TFLOPS/MFU of the steps_per_print line; ``deepspeed.profiling`` under the --as-deepspeed
switch."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dslaunch.profiling.flops_profiler import FlopsProfiler, get_model_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def _profile(model, *args, shape=None):
    return get_model_profile(model, input_shape=shape, args=list(args), print_profile=False,
                             as_string=False, warm_up=0)


class _FunctionalMLP(nn.Module):
    """The weights of nn.Sequential(Linear(8, 16), ReLU(), Linear(16, 4)), called as functionals."""

    def __init__(self, ref):
        super().__init__()
        self.w1, self.b1 = ref[0].weight, ref[0].bias
        self.w2, self.b2 = ref[2].weight, ref[2].bias

    def forward(self, x):
        h = F.relu(F.linear(x, self.w1, self.b1))
        return h @ self.w2.t() + self.b2


def test_linear_counts_by_hand():
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    macs = 3 * 8 * 16 + 3 * 16 * 4
    params = (8 * 16 + 16) + (16 * 4 + 4)
    flops = 2 * macs + 3 * 16 + 3 * 4 + 3 * 16  # bias adds, ReLU: one per element
    assert _profile(mlp, shape=(3, 8)) == (flops, macs, params)
    # the same arithmetic through F.linear, F.relu and @: the same counts
    assert _profile(_FunctionalMLP(mlp), torch.randn(3, 8)) == (flops, macs, params)
    assert get_model_profile(mlp, input_shape=(3, 8), print_profile=False) == \
        ("1.26 K", "576 MACs", "212")


@pytest.mark.parametrize("conv, shape, macs", [
    (nn.Conv2d(3, 6, 3, padding=1), (2, 3, 10, 10), 2 * 6 * 10 * 10 * 3 * 9),
    (nn.Conv2d(4, 8, 3, stride=2, groups=2), (1, 4, 9, 9), 8 * 4 * 4 * (4 // 2) * 9),
    (nn.Conv1d(2, 5, 4, bias=False), (3, 2, 10), 3 * 5 * 7 * 2 * 4),
    (nn.ConvTranspose2d(4, 2, 2, stride=2), (1, 4, 3, 3), 4 * 3 * 3 * 2 * 4),
])
def test_conv_counts_by_hand(conv, shape, macs):
    flops, got_macs, params = _profile(conv, shape=shape)
    assert got_macs == macs
    assert params == sum(p.numel() for p in conv.parameters())
    out = conv(torch.randn(shape))
    assert flops == 2 * macs + (out.numel() if conv.bias is not None else 0)


class _SDPA(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _MatmulAttention(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


class _MHA(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=batch_first)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def test_attention_counts_by_hand():
    b, h, lq, lk, e = 2, 4, 16, 12, 8
    for ev in (e, 6):  # the fused kernel; a value width it does not take (torch's math path)
        q, k, v = torch.randn(b, h, lq, e), torch.randn(b, h, lk, e), torch.randn(b, h, lk, ev)
        macs = b * h * lq * lk * e + b * h * lq * lk * ev  # QK^T, then AV
        flops, got_macs, params = _profile(_SDPA(), q, k, v)
        assert (got_macs, params) == (macs, 0) and flops >= 2 * macs
        if ev == e:
            assert flops == 2 * macs
        assert _profile(_MatmulAttention(), q, k, v)[1] == macs
    # nn.MultiheadAttention, on its composite path and on its one-kernel inference fast path
    tokens, d = 5, 16
    mha_macs = 4 * tokens * d * d + 2 * tokens * tokens * d
    assert _profile(_MHA(False), shape=(tokens, 1, d))[1:] == (mha_macs, 4 * d * d + 4 * d)
    assert _profile(_MHA(True), shape=(1, tokens, d))[1] == mha_macs


def test_profiler_lifecycle(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2)))
    x = torch.randn(5, 4)
    prof = FlopsProfiler(model)
    prof.start_profile()
    loss = model(x).sum()
    macs = 5 * 4 * 4 + 5 * 4 * 2
    assert prof.get_total_macs() == macs and prof.get_total_params() == 30
    loss.backward()  # backward is not a forward: not counted
    assert prof.get_total_macs() == macs and prof.get_total_duration() > 0
    assert prof.get_total_macs(as_string=True) == "120 MACs"
    out = tmp_path / "sub" / "profile.txt"
    prof.print_model_profile(profile_step=3, output_file=str(out))
    text = out.read_text()
    assert "Profile summary at step 3" in text and "(1): Sequential(" in text
    assert "in_features=4, out_features=2" in text  # the module's own repr kept
    prof.stop_profile()
    model(x)  # stopped: no longer counted
    assert prof.get_total_macs() == macs
    prof.end_profile()
    assert not any(hasattr(m, "__flops__") or m._forward_hooks for m in model.modules())


def test_engine_profiled_step_and_mfu_line(tmp_path, monkeypatch, capsys):
    import dslaunch
    from gpt import GPT, GPTConfig

    monkeypatch.setenv("DSLAUNCH_CACHE_DIR", str(tmp_path / "cache"))  # the CPU peak is measured
    cfg = GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg)
    micro = 2
    out = tmp_path / "flops.txt"
    ds = {"train_micro_batch_size_per_gpu": micro, "steps_per_print": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
          "flops_profiler": {"enabled": True, "profile_step": 1, "output_file": str(out)}}
    engine, *_ = dslaunch.initialize(model=model, config=ds)
    for _ in range(2):
        x = torch.randint(0, cfg.vocab_size, (micro, cfg.seq_len))
        engine.backward(engine(x, x))
        engine.step()
    printed = capsys.readouterr().out
    prof = engine._flops.profiled
    tokens = micro * cfg.seq_len
    n = model.num_params() - model.tok_emb.weight.numel() - model.pos_emb.weight.numel()
    attention_fwd = cfg.n_layer * 2 * 2 * micro * cfg.seq_len ** 2 * cfg.d_model  # QK^T, AV
    expected = 6 * n * tokens + 3 * attention_fwd
    assert abs(3 * prof["fwd_flops"] / expected - 1) < 0.02
    assert prof["params"] == model.num_params()
    assert prof["fwd"] > 0 and prof["bwd"] > 0 and prof["step"] > 0
    text = out.read_text()
    assert "bwd latency" in text and "step latency" in text and "(head): Linear(" in text
    assert "FLOPs profile of step 1 written to" in printed
    assert "MFU peak per rank: CPU matmul roofline" in printed and "(measured)" in printed
    line = next(ln for ln in printed.splitlines() if ln.startswith("[dslaunch] step 2 "))
    assert " TFLOPS/rank " in line and " MFU " in line
    assert (tmp_path / "cache" / "cpu_peak.json").exists()


def test_as_deepspeed_resolves_ours():
    from dslaunch import as_deepspeed

    as_deepspeed.install()
    try:
        import deepspeed.comm as ds_comm
        from deepspeed.profiling.flops_profiler import FlopsProfiler as Theirs
        from deepspeed.profiling.flops_profiler import get_model_profile as theirs
    finally:
        as_deepspeed.uninstall()
    assert Theirs is FlopsProfiler and theirs is get_model_profile
    assert callable(ds_comm.configure) and ds_comm.comms_logger.enabled in (True, False)


def test_device_peaks(tmp_path):
    from dslaunch.engine.observe.profiling.peak import cpu_peak, gpu_peak

    assert gpu_peak("NVIDIA H100 80GB HBM3", torch.bfloat16) == \
        (989.4e12, "spec table: H100 bf16 dense 989.4 TFLOPS")
    assert gpu_peak("NVIDIA H100 PCIe", torch.float16)[0] == 756.0e12
    assert gpu_peak("NVIDIA A100-SXM4-80GB", torch.float32)[0] in (19.5e12, 156.0e12)  # TF32 on?
    assert gpu_peak("Some Future GPU", torch.bfloat16) is None
    first, how = cpu_peak(torch.float32, cache_dir=tmp_path)
    again, how_again = cpu_peak(torch.float32, cache_dir=tmp_path)
    assert first > 0 and again == first
    assert how.endswith("(measured)") and how_again.endswith("(cached)")
