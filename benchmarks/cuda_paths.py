#!/usr/bin/env python
"""Every engine path once on one device (issue 31 part 6): each path trains examples/gpt.py's small
GPT (bf16) for a few steps through dslaunch's public API, or checks a kernel against its CPU
reference, and the results go to one JSON file rewritten after every path.

    python3 benchmarks/cuda_paths.py --device cuda --prebuild --out $OUT/cuda_paths.json
    .venv/bin/python benchmarks/cuda_paths.py --device cpu --paths baseline,tiled --out /tmp/p.json

Paths (``--paths a,b`` runs a subset, in this order):

- ``cuda_kernels``: quantize (int8/int4, fp32/bf16 in, fp32/bf16 out, accumulate) of the CUDA op
  equal bit for bit to the CPU op; fused Adam, 1-bit pack/unpack and bf16 conversion vs the CPU op
  / torch (tests/test_ops_cuda.py's checks). On CPU: the compiled cpu_quantize op vs the torch
  reference.
- ``baseline``: ZeRO 0, bf16, AdamW: the reference losses of the engine paths below.
- ``activation_checkpointing``: ``dslaunch.checkpointing.checkpoint`` around each block and the
  config's ``activation_checkpointing`` section: losses vs baseline.
- ``tiled``: TiledMLP (4 tiles) + TiledFusedLogitsLoss (4 tiles): losses vs baseline, and one fp32
  forward/backward (loss and every gradient) vs the untiled model.
- ``moe_ep1``: examples/moe_gpt.py (dslaunch.moe.layer.MoE, 4 experts, top-1, ep 1), ZeRO 1.
- ``onebit_adam``: OneBitAdam, freeze_step 2 so steps 3.. run the compression stage; on one rank
  the compressed all-reduce has nobody to talk to (the compression's error feedback still runs).
- ``zeropp_quantized``: ZeRO-3 with zero_quantized_weights + zero_quantized_gradients (on one rank
  there is no gather to quantize; the path must still train).
- ``flops_profiler``: the flops_profiler section (profile_step 1) and the MFU print line:
  TFLOPS, MFU, and the peak the engine used (``GPU_PEAK_TFLOPS`` spec table on CUDA, the measured
  matmul roofline on CPU).
- ``async_checkpoint``: ``save_checkpoint(async_save=True)`` after 2 steps, 2 steps while it writes,
  ``wait_checkpoint``; a fresh engine loads it and its next losses equal the first engine's.
- ``offload_states_zero3``: ZeRO-3 bf16: offload_states / reload_states / offload_states /
  reload_states, then training; losses equal a run without the round trips (on CUDA: memory
  drops while offloaded).
- ``nvme_offload``: ZeRO-3 offload_param + offload_optimizer nvme under ``--nvme-dir``; the
  async_io and cpu_adam op loads are timed.

Isolation: the paths run in this one process (one torch import, one CUDA context: the GPU time is
precious; a subprocess per path costs ~5-10 s of imports and CUDA start each). Each path has a
time limit: SIGALRM raises in the main thread at the limit (a Python loop, a sleep or a wait that
returns to the interpreter stops there); a watchdog thread at limit + ``--grace`` catches a path
stuck inside C code (a collective, a CUDA sync): it records the path as ``timeout`` with the main
thread's stack, writes the JSON and re-executes this script with ``--resume`` (fresh process, fresh
CUDA context), which skips the paths already in the JSON. A path that leaves the CUDA context
broken (a device-side assert: ``torch.cuda.synchronize()`` raises after it) re-executes the same
way. ``--isolate`` runs each path in its own subprocess instead (slower, for when in-process
state is suspected).

``--prebuild``: first builds, in parallel subprocesses, the compiled ops the chosen paths load
(``python -m dslaunch.kernels.builder <op>``), so that no path pays a compile inside its limit.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

PATHS = ["cuda_kernels", "baseline", "activation_checkpointing", "tiled", "moe_ep1", "onebit_adam",
         "zeropp_quantized", "flops_profiler", "async_checkpoint", "offload_states_zero3",
         "nvme_offload"]
# the compiled ops a path loads (built up front by --prebuild)
OPS_OF = {
    "cuda_kernels": {"cpu": ["cpu_quantize"],
                     "cuda": ["cpu_quantize", "cuda_quantize", "cpu_adam", "cuda_fused_adam",
                              "cuda_onebit", "cuda_bf16"]},
    "onebit_adam": {"cpu": ["onebit_pack"], "cuda": []},
    "zeropp_quantized": {"cpu": ["cpu_quantize"], "cuda": ["cpu_quantize", "cuda_quantize"]},
    "nvme_offload": {"cpu": ["async_io", "cpu_adam"], "cuda": ["async_io", "cpu_adam"]},
}
# seconds, else --limit
LIMITS = {"nvme_offload": 300, "cuda_kernels": 240, "flops_profiler": 180,
          "_selftest_timeout": 2, "_selftest_hang": 2}
STEPS = 5


class PathTimeout(Exception):
    pass


class Skip(Exception):
    pass


class CheckFailed(Exception):
    pass


# -------------------------------------------------------------------------------------------------
# results file


class Results:
    def __init__(self, path: Path, meta: dict, resume: bool):
        self.path = path
        self.lock = threading.Lock()
        self.data = {"meta": meta, "prebuild": None, "paths": {}}
        if resume and path.exists():
            old = json.loads(path.read_text())
            self.data["prebuild"] = old.get("prebuild")
            self.data["paths"] = old.get("paths", {})
            self.data["meta"]["restarts"] = old.get("meta", {}).get("restarts", 0) + 1
            self.data["meta"]["started"] = old.get("meta", {}).get("started", meta["started"])

    def put(self, name, record):
        with self.lock:
            self.data["paths"][name] = record
            self.write()

    def write(self):
        c = self.data["paths"]
        self.data["summary"] = {s: sorted(n for n, r in c.items() if r["status"] == s)
                                for s in ("ok", "failed", "skipped", "timeout")}
        self.data["meta"]["elapsed_s"] = round(time.time() - self.data["meta"]["started"], 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def line(name, rec):
    keys = ("summary", "reason", "error")
    tail = next((str(rec[k]) for k in keys if rec.get(k)), "")
    print(f"[cuda_paths] {name:26s} {rec['status']:8s} {rec.get('seconds', 0):7.1f}s  "
          f"{tail[:200]}", flush=True)


# -------------------------------------------------------------------------------------------------
# shared helpers of the paths


class Ctx:
    def __init__(self, args):
        self.args = args
        self.device_kind = args.device
        self.cuda = args.device == "cuda"
        self.ref_losses = None  # the baseline path's
        self.tmp = Path(tempfile.mkdtemp(prefix="cuda_paths_"))
        self._data = None

    def data(self):
        if self._data is None:
            from gpt import TextBatches, stdlib_bytes

            self._data = TextBatches(stdlib_bytes(1 << 20), seq_len=self.args.seq_len,
                                     global_batch=self.args.micro, seed=0)
        return self._data

    def gpt_cfg(self):
        from gpt import GPTConfig

        a = self.args
        return GPTConfig(seq_len=a.seq_len, n_layer=a.n_layer, n_head=a.n_head, d_model=a.d_model)

    def gpt(self):
        import torch

        from gpt import GPT

        torch.manual_seed(0)
        return GPT(self.gpt_cfg())

    def config(self, **extra):
        cfg = {"train_micro_batch_size_per_gpu": self.args.micro, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                         "eps": 1e-8, "weight_decay": 0.1}},
               "gradient_clipping": 1.0, "steps_per_print": 1000, "bf16": {"enabled": True}}
        for k, v in extra.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        return cfg

    def train(self, engine, steps=STEPS, start=0, data=None):
        import torch

        losses = []
        for s in range(start, start + steps):
            tok, tgt = (data or self.data()).batch_at(s)
            tok, tgt = tok.to(engine.device), tgt.to(engine.device)
            loss = engine(tok, tgt)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach().float().item()))
        if self.cuda:
            torch.cuda.synchronize()
        return losses


def initialize(model, config, **kw):
    import dslaunch

    params = kw.pop("model_parameters", None)
    engine, *_ = dslaunch.initialize(model=model, config=config,
                                     model_parameters=params if params is not None
                                     else model.parameters(), **kw)
    return engine


def finite(losses):
    return all(math.isfinite(x) for x in losses)


def check_train(rec, losses, ref=None, tol=None, exact=False):
    """Losses finite and falling (last < first), or within ``tol`` (relative) of ``ref``."""
    rec["losses"] = [round(x, 6) for x in losses]
    if not finite(losses):
        raise CheckFailed(f"non-finite loss: {losses}")
    if ref is not None:
        n = min(len(ref), len(losses))
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], ref[:n]))
        rec["max_rel_diff_vs_baseline"] = diff
        rec["bit_equal_to_baseline"] = losses[:n] == ref[:n]
        if exact and losses[:n] != ref[:n]:
            raise CheckFailed(f"losses differ from the reference (max rel {diff:.3g}): "
                              f"{losses} vs {ref}")
        if tol is not None and diff > tol:
            raise CheckFailed(f"losses off the baseline by {diff:.3g} > {tol}: {losses} vs {ref}")
    if len(losses) > 1 and not losses[-1] < losses[0]:
        raise CheckFailed(f"loss did not fall: {losses}")
    return f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" + (
        f" (max rel diff vs baseline {rec['max_rel_diff_vs_baseline']:.2g})" if ref else "")


def need_ref(ctx):
    if ctx.ref_losses is None:  # baseline not run in this process: run it now (not recorded)
        ctx.ref_losses = ctx.train(initialize(ctx.gpt(), ctx.config()))
    return ctx.ref_losses


def timed_load(name):
    """(loaded?, seconds) for ``load_op(name)``: a build if the cache lacks it."""
    import warnings

    from dslaunch.kernels import load_op

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        op = load_op(name)
    return op is not None, round(time.perf_counter() - t0, 2), [str(x.message)[:300] for x in w]


# bf16 trajectories: a different summation order (recompute, tiles, another optimizer kernel) moves
# the losses by bf16 rounding; 5 steps stay within a few 1e-3 in practice, 2e-2 is the bound.
BF16_TOL = 2e-2


# -------------------------------------------------------------------------------------------------
# the paths


def p_cuda_kernels(ctx, rec):
    import torch

    from dslaunch.kernels import quantize as Q

    loads = {}
    for op in OPS_OF["cuda_kernels"][ctx.device_kind]:
        ok, secs, warns = timed_load(op)
        loads[op] = {"loaded": ok, "seconds": secs, **({"warnings": warns} if warns else {})}
    rec["op_loads"] = loads
    missing = [op for op, v in loads.items() if not v["loaded"]]
    if missing:
        raise CheckFailed(f"ops not loaded: {missing}: {[loads[m].get('warnings') for m in missing]}")
    cases = 0
    for bits in (8, 4):
        for dtype in (torch.float32, torch.bfloat16):
            for n, block in ((1, 6), (4097, 256), (100_003, 2048)):
                x = (torch.randn(n) * torch.logspace(-3, 2, n)).to(dtype)
                q, s = Q.quantize(x, bits, block)  # the compiled CPU op
                if ctx.cuda:
                    qo, so = Q.quantize(x.cuda(), bits, block)
                    qo, so = qo.cpu(), so.cpu()
                else:
                    qo, so = Q.quantize(x, bits, block, use_compiled=False)  # torch reference
                if not (torch.equal(qo, q) and torch.equal(so, s)):
                    raise CheckFailed(f"quantize differs: bits {bits} {dtype} n {n} block {block}")
                for out_dtype in (torch.float32, torch.bfloat16):
                    d = Q.dequantize(q, s, n, bits, block, dtype=out_dtype)
                    if ctx.cuda:
                        do = Q.dequantize(q.cuda(), s.cuda(), n, bits, block, dtype=out_dtype).cpu()
                    else:
                        do = Q.dequantize(q, s, n, bits, block, dtype=out_dtype, use_compiled=False)
                    if not torch.equal(do, d):
                        raise CheckFailed(f"dequantize differs: bits {bits} {dtype} n {n} {out_dtype}")
                acc = x.float().clone()
                Q.dequantize(q, s, n, bits, block, out=acc, accumulate=True)
                if ctx.cuda:
                    acco = x.float().cuda()
                    Q.dequantize(q.cuda(), s.cuda(), n, bits, block, out=acco, accumulate=True)
                    acco = acco.cpu()
                else:
                    acco = x.float().clone()
                    Q.dequantize(q, s, n, bits, block, out=acco, accumulate=True,
                                 use_compiled=False)
                if not torch.equal(acco, acc):
                    raise CheckFailed(f"dequantize accumulate differs: bits {bits} {dtype} n {n}")
                cases += 1
    rec["quantize_cases_bit_equal"] = cases
    rec["quantize_compared"] = "cuda op vs cpu op" if ctx.cuda else "cpu op vs torch reference"
    if not ctx.cuda:
        rec["note"] = "fused_adam / onebit / bf16 CUDA ops need CUDA: not run on CPU"
        return f"quantize {cases} cases bit-equal ({rec['quantize_compared']})"
    from dslaunch.engine.optim.onebit.compressed import pack_bits
    from dslaunch.kernels import cpu_optim, cuda_ops

    torch.manual_seed(0)
    sizes = [1, 7, 1023, 70000]
    ps = [torch.randn(n) for n in sizes]
    gs = [torch.randn(n) for n in sizes]
    cpu = [(p.clone(), torch.zeros(n), torch.zeros(n)) for p, n in zip(ps, sizes)]
    gpu = [(p.cuda(), torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda"))
           for p, n in zip(ps, sizes)]
    for s in range(1, 11):
        for (p, m, v), g in zip(cpu, gs):
            cpu_optim.adam_step(p, g, m, v, step=s, lr=1e-2, weight_decay=0.1, adamw=True)
        if not cuda_ops.fused_adam([t[0] for t in gpu], [g.cuda() for g in gs],
                                   [t[1] for t in gpu], [t[2] for t in gpu], step=s, lr=1e-2,
                                   weight_decay=0.1, adamw=True):
            raise CheckFailed("cuda_ops.fused_adam fell back to torch")
    adam_err = max(float((pg.cpu() - p).abs().max() / p.abs().max())
                   for (p, _, _), (pg, _, _) in zip(cpu, gpu))
    rec["fused_adam_max_rel_err_vs_cpu_op"] = adam_err
    if adam_err > 1e-6:
        raise CheckFailed(f"fused_adam vs cpu op: {adam_err:.3g} > 1e-6")
    x = torch.randn(4096 * 3 + 8, device="cuda")
    err = torch.zeros_like(x)
    bits, scales = cuda_ops.onebit_pack(x, err, block=4096)
    if not torch.equal(bits.cpu(), pack_bits((x >= 0).cpu())):
        raise CheckFailed("onebit_pack bits differ from pack_bits")
    out = torch.empty_like(x)
    cuda_ops.onebit_unpack(bits, scales, out, block=4096)
    torch.testing.assert_close(out + err, x)
    if not torch.equal(cuda_ops.to_bf16(x), x.bfloat16()):
        raise CheckFailed("to_bf16 differs from torch")
    if not torch.equal(cuda_ops.to_f32(x.bfloat16()), x.bfloat16().float()):
        raise CheckFailed("to_f32 differs from torch")
    rec["onebit_and_bf16_ops"] = "equal to torch"
    return (f"quantize {cases} cases bit-equal (cuda vs cpu op); fused_adam rel err "
            f"{adam_err:.2g}; onebit, bf16 ok")


def p_baseline(ctx, rec):
    engine = initialize(ctx.gpt(), ctx.config())
    rec["engine_device"] = str(engine.device)
    losses = ctx.train(engine)
    ctx.ref_losses = losses
    return check_train(rec, losses)


def p_activation_checkpointing(ctx, rec):
    """Each block checkpointed, the saved inputs on the device, then in host memory
    (cpu_checkpointing, as configs/gpt_activation_checkpointing.json): both vs the baseline."""
    import dslaunch
    from dslaunch.engine.features import activation_checkpoint as ck

    ref = need_ref(ctx)
    out = []
    for cpu in (False, True):
        model = ctx.gpt().use_long_sequence(checkpoint=dslaunch.checkpointing.checkpoint)
        cfg = ctx.config(activation_checkpointing={
            "partition_activations": False, "cpu_checkpointing": cpu,
            "contiguous_memory_optimization": False, "number_checkpoints": None,
            "synchronize_checkpoint_boundary": ctx.cuda, "profile": False})
        engine = initialize(model, cfg)
        if bool(ck.CPU_CHECKPOINT) != cpu:
            raise CheckFailed(f"cpu_checkpointing {cpu} not applied (CPU_CHECKPOINT "
                              f"{ck.CPU_CHECKPOINT})")
        sub = {}
        out.append(("cpu_checkpointing" if cpu else "device") + ": " +
                   check_train(sub, ctx.train(engine), ref, BF16_TOL))
        rec["cpu_checkpointing" if cpu else "on_device"] = sub
    ck.configure(None, checkpoint_in_cpu=False)  # later paths: the module's defaults back
    return "; ".join(out)


def p_tiled(ctx, rec):

    from dslaunch.sequence.tiled import TiledFusedLogitsLoss, TiledMLP

    ref = need_ref(ctx)
    dev = "cuda" if ctx.cuda else "cpu"
    # one fp32 forward/backward, tiled vs untiled, on the device
    plain = ctx.gpt().to(dev)
    tiled = ctx.gpt().to(dev).use_long_sequence(tiled_mlp=TiledMLP, mlp_tiles=4,
                                                tiled_loss=TiledFusedLogitsLoss, loss_tiles=4)
    tok, tgt = (t.to(dev) for t in ctx.data().batch_at(0))
    got = []
    for m in (plain, tiled):
        loss = m(tok, tgt)
        loss.backward()
        got.append((loss.detach(), [p.grad for p in m.parameters()]))
    (l0, g0), (l1, g1) = got
    loss_rel = float((l1 - l0).abs() / l0.abs())
    grad_rel = max(float((b - a).abs().max() / a.abs().max().clamp_min(1e-30))
                   for a, b in zip(g0, g1))
    rec["fp32_loss_rel_diff"], rec["fp32_grad_max_rel_diff"] = loss_rel, grad_rel
    if loss_rel > 1e-5 or grad_rel > 1e-4:
        raise CheckFailed(f"tiled fp32 vs untiled: loss rel {loss_rel:.3g}, grad rel {grad_rel:.3g}")
    del plain, tiled, got
    model = ctx.gpt().use_long_sequence(tiled_mlp=TiledMLP, mlp_tiles=4,
                                        tiled_loss=TiledFusedLogitsLoss, loss_tiles=4)
    losses = ctx.train(initialize(model, ctx.config()))
    return (check_train(rec, losses, ref, BF16_TOL) +
            f"; fp32 tiled vs plain: loss {loss_rel:.2g}, grads {grad_rel:.2g}")


def p_moe_ep1(ctx, rec):
    import torch
    from moe_gpt import MoEGPT

    from dslaunch.engine.parallel import expert_groups
    from dslaunch.moe.layer import MoE

    expert_groups.reset()
    try:
        torch.manual_seed(0)
        model = MoEGPT(ctx.gpt_cfg(), MoE, experts=4, ep=1, top_k=1, capacity_factor=1.0,
                       min_capacity=4, dropless=False, aux_coef=0.01)
        engine = initialize(model, ctx.config(zero_optimization={"stage": 1}))
        losses = ctx.train(engine)
        rec["aux_loss_last"] = model.last_aux
        rec["dropped_fraction_last"] = model.dropped_fraction()
        return check_train(rec, losses) + f", aux {model.last_aux:.4f}"
    finally:
        expert_groups.reset()


def p_onebit_adam(ctx, rec):
    opt = {"type": "OneBitAdam", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                             "weight_decay": 0.0, "freeze_step": 2,
                                             "cuda_aware": False, "comm_backend_name": "gloo"}}
    engine = initialize(ctx.gpt(), ctx.config(optimizer=opt))
    losses = ctx.train(engine)
    o = engine.optimizer
    inner = getattr(o, "optimizer", o)
    stage = next((f() for f in (getattr(o, "in_compression_stage", None),
                                getattr(inner, "in_compression_stage", None)) if f), None)
    rec["in_compression_stage_after"] = stage
    rec["note"] = ("world size 1: the compressed all-reduce is trivial (no peer); steps 3-5 run the "
                   "compression stage (frozen variance, 1-bit error feedback) locally")
    if stage is False:
        raise CheckFailed("not in the compression stage after freeze_step")
    return check_train(rec, losses) + f", compression stage {stage}"


def p_zeropp_quantized(ctx, rec):
    ref = need_ref(ctx)
    zero = {"stage": 3, "reduce_bucket_size": 2e6, "stage3_prefetch_bucket_size": 2e6,
            "stage3_max_live_parameters": 4e6, "stage3_param_persistence_threshold": 1e4,
            "zero_quantized_weights": True, "zero_quantized_gradients": True}
    losses = ctx.train(initialize(ctx.gpt(), ctx.config(zero_optimization=zero)))
    rec["note"] = "world size 1: no gather or reduce-scatter to quantize"
    return check_train(rec, losses, ref, BF16_TOL)


class Tee(io.TextIOBase):
    def __init__(self, out):
        self.out, self.buf = out, io.StringIO()

    def write(self, s):
        self.buf.write(s)
        return self.out.write(s)

    def flush(self):
        self.out.flush()


def p_flops_profiler(ctx, rec):
    import torch

    from dslaunch.engine.observe.profiling.peak import device_peak
    from gpt import GPT, TextBatches, bench_config, stdlib_bytes

    big = ctx.args.flops_model == "bench" or (ctx.args.flops_model == "auto" and ctx.cuda)
    if big:  # the benchmarks' 27M-parameter GPT (examples/gpt.py bench_config): a real MFU
        mcfg, micro, steps, every = bench_config(), 16, 12, 4
    else:
        mcfg, micro, steps, every = ctx.gpt_cfg(), ctx.args.micro, 6, 2
    data = TextBatches(stdlib_bytes(1 << 20), seq_len=mcfg.seq_len, global_batch=micro, seed=0,
                       vocab_size=mcfg.vocab_size)
    out = ctx.tmp / "flops_profile.txt"
    cfg = ctx.config(steps_per_print=every, train_micro_batch_size_per_gpu=micro, flops_profiler={
        "enabled": True, "profile_step": 1, "output_file": str(out)})
    torch.manual_seed(0)
    model = GPT(mcfg)
    rec["model"] = {"params": model.num_params(), "n_layer": mcfg.n_layer,
                    "d_model": mcfg.d_model, "seq_len": mcfg.seq_len,
                    "vocab": mcfg.vocab_size, "micro": micro, "steps": steps}
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        engine = initialize(model, cfg)
        losses = ctx.train(engine, steps=steps, data=data)
    printed = tee.buf.getvalue().splitlines()
    prof = dict(engine._flops.profiled or {})
    rec["profiled_step"] = {k: v for k, v in prof.items() if isinstance(v, (int, float, str))}
    rec["profile_file_written"] = out.exists() and "bwd latency" in out.read_text()
    peak, source = device_peak(engine.device, torch.bfloat16)
    rec["peak_flops"], rec["peak_source"] = peak, source
    if ctx.cuda:
        rec["gpu_name"] = torch.cuda.get_device_name()
    mfu_lines = [ln for ln in printed if " TFLOPS/rank " in ln]
    rec["mfu_lines"] = mfu_lines[-3:]
    rec["peak_line"] = next((ln for ln in printed if "MFU peak per rank" in ln), None)
    import re

    last = mfu_lines[-1] if mfu_lines else ""
    m_t = re.search(r"TFLOPS/rank ([0-9.eE+-]+)", last)
    m_m = re.search(r"MFU ([0-9.eE+-]+)%", last)
    rec["tflops"] = float(m_t.group(1)) if m_t else None
    rec["mfu_percent"] = float(m_m.group(1)) if m_m else None
    if not mfu_lines or rec["tflops"] is None:
        raise CheckFailed("no TFLOPS/MFU print line")
    if ctx.cuda and not source.startswith("spec table"):
        raise CheckFailed(f"GPU peak not from the spec table: {source}")
    if not rec["profile_file_written"]:
        raise CheckFailed(f"profile output {out} missing or incomplete")
    # the profiled forward against the hand count (tests/test_flops_profiler.py's formula)
    n = model.num_params() - model.tok_emb.weight.numel() - model.pos_emb.weight.numel()
    tokens = micro * mcfg.seq_len
    expected = 2 * n * tokens + mcfg.n_layer * 2 * 2 * micro * mcfg.seq_len ** 2 * mcfg.d_model
    if prof.get("fwd_flops"):
        rec["fwd_flops_vs_hand_count"] = prof["fwd_flops"] / expected
        if abs(prof["fwd_flops"] / expected - 1) > 0.05:
            raise CheckFailed(f"profiled forward FLOPs {prof['fwd_flops']:.4g} vs hand count "
                              f"{expected:.4g}")
    if rec["tflops"] and rec["mfu_percent"] is not None:
        rec["mfu_recomputed_percent"] = 100 * rec["tflops"] * 1e12 / peak
    check_train(rec, losses)
    return (f"TFLOPS {rec['tflops']} MFU {rec['mfu_percent']}% peak {peak / 1e12:.4g} TFLOPS "
            f"({source}); fwd FLOPs {prof.get('fwd_flops')}")


def p_async_checkpoint(ctx, rec):
    d = ctx.tmp / "async_ckpt"
    e1 = initialize(ctx.gpt(), ctx.config())
    first = ctx.train(e1, steps=2)
    t0 = time.perf_counter()
    e1.save_checkpoint(str(d), tag="s2", async_save=True)
    rec["save_call_s"] = round(time.perf_counter() - t0, 3)
    after = ctx.train(e1, steps=3, start=2)
    t0 = time.perf_counter()
    e1.wait_checkpoint()
    rec["wait_s"] = round(time.perf_counter() - t0, 3)
    latest = (d / "latest").read_text().strip() if (d / "latest").exists() else None
    rec["latest"] = latest
    if latest != "s2":
        raise CheckFailed(f"latest is {latest!r}, not s2")
    e2 = initialize(ctx.gpt(), ctx.config())
    path, _ = e2.load_checkpoint(str(d))
    rec["loaded"] = str(path)
    resumed = ctx.train(e2, steps=3, start=2)
    rec["resumed_losses"] = resumed
    check_train(rec, first + after)
    # the first resumed loss is a forward of the saved weights: bit-equal anywhere. The later ones
    # follow backwards, which on CUDA are not deterministic (SDPA's flash backward): bf16 bound.
    if ctx.cuda:
        if resumed[0] != after[0]:
            raise CheckFailed(f"first loss after load {resumed[0]} != {after[0]} (saved weights)")
        diff = max(abs(a - b) / abs(b) for a, b in zip(resumed, after))
        rec["resumed_max_rel_diff"], rec["resumed_bit_equal"] = diff, resumed == after
        if diff > BF16_TOL:
            raise CheckFailed(f"resumed losses {resumed} vs continued {after}: {diff:.3g}")
    elif resumed != after:
        raise CheckFailed(f"resumed losses {resumed} != continued {after}")
    return (f"save call {rec['save_call_s']}s, wait {rec['wait_s']}s; resumed losses "
            f"{'equal' if resumed == after else 'first equal, then within bf16'}: "
            f"{[round(x, 5) for x in resumed]}")


def p_offload_states_zero3(ctx, rec):
    import torch

    from dslaunch.runtime.zero.offload_config import OffloadDeviceEnum

    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    want = ctx.train(initialize(ctx.gpt(), ctx.config(zero_optimization=zero)), steps=4)
    e = initialize(ctx.gpt(), ctx.config(zero_optimization=zero))
    got = ctx.train(e, steps=2)
    mem = {}

    def snap(k):
        if ctx.cuda:
            torch.cuda.synchronize()
            mem[k] = torch.cuda.memory_allocated()

    def probe():  # a forward of the current weights (deterministic): must survive the trips
        import torch

        tok, tgt = (t.to(e.device) for t in ctx.data().batch_at(99))
        with torch.no_grad():
            return float(e(tok, tgt).float().item())

    before = probe()
    snap("before")
    e.offload_states(device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False)
    snap("offloaded_1")
    e.reload_states(non_blocking=False)
    snap("reloaded_1")
    probes = [probe()]
    e.offload_states(device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False)
    snap("offloaded_2")
    try:  # training while the states are away is refused with the reason (DeepSpeed's rule)
        probe()
        rec["forward_while_offloaded"] = "ran (expected a refusal)"
    except RuntimeError as exc:
        rec["forward_while_offloaded"] = f"refused: {str(exc)[:200]}"
    e.reload_states(non_blocking=False)
    snap("reloaded_2")
    probes.append(probe())
    rec["probe_losses"] = {"before": before, "after_reloads": probes}
    got += ctx.train(e, steps=2, start=2)
    rec["memory_allocated"] = mem
    rec["reference_losses"] = want
    check_train(rec, got)
    if probes != [before, before]:
        raise CheckFailed(f"weights changed by the round trips: forward {before} -> {probes}")
    if ctx.cuda:  # backward is not deterministic on CUDA: the bf16 bound against the reference
        diff = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        rec["max_rel_diff_vs_reference"], rec["bit_equal_to_reference"] = diff, got == want
        if diff > BF16_TOL:
            raise CheckFailed(f"losses after the round trips {got} vs without {want}: {diff:.3g}")
        if not mem["offloaded_1"] < mem["before"]:
            raise CheckFailed(f"GPU memory did not drop when offloaded: {mem}")
    elif got != want:
        raise CheckFailed(f"losses after the round trips {got} != without {want}")
    return ("2 round trips: same forward after each, training goes on like a run without" + (
        f"; GPU MB {mem['before'] >> 20} -> {mem['offloaded_1'] >> 20} -> "
        f"{mem['reloaded_2'] >> 20}" if ctx.cuda else ""))


def p_nvme_offload(ctx, rec):
    ref = need_ref(ctx)
    loads = {}
    for op in OPS_OF["nvme_offload"][ctx.device_kind]:
        ok, secs, warns = timed_load(op)
        loads[op] = {"loaded": ok, "seconds": secs, **({"warnings": warns} if warns else {})}
    rec["op_loads"] = loads
    nvme = Path(ctx.args.nvme_dir) / f"run{os.getpid()}"
    nvme.mkdir(parents=True, exist_ok=True)
    engine = None
    try:
        try:
            from dslaunch.nvme.aio import probe_direct

            ok, why = probe_direct(nvme)
            rec["io_mode"] = "O_DIRECT" if ok else f"buffered ({why})"
        except Exception as exc:  # informative only
            rec["io_mode"] = f"unknown ({type(exc).__name__}: {exc})"
        zero = {"stage": 3, "sub_group_size": 1e6,
                "stage3_param_persistence_threshold": 100,
                "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme),
                                      "buffer_count": 4, "pin_memory": ctx.cuda},
                "offload_param": {"device": "nvme", "nvme_path": str(nvme), "buffer_count": 5,
                                  "buffer_size": 1e8, "max_in_cpu": 0,
                                  "pin_memory": ctx.cuda}}
        aio = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 2,
               "single_submit": False, "overlap_events": True}
        t0 = time.perf_counter()
        engine = initialize(ctx.gpt(), ctx.config(zero_optimization=zero, aio=aio))
        rec["initialize_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        losses = ctx.train(engine)
        rec["train_s"] = round(time.perf_counter() - t0, 2)
        files = [p for p in nvme.rglob("*") if p.is_file()]
        rec["swap_files"] = len(files)
        rec["swap_bytes"] = sum(p.stat().st_size for p in files)
        if not files:
            raise CheckFailed(f"no swap files under {nvme}")
        return (check_train(rec, losses, ref, BF16_TOL) +
                f"; {len(files)} swap files {rec['swap_bytes'] >> 20} MB, {rec['io_mode']}; op loads "
                + ", ".join(f"{k} {v['seconds']}s" for k, v in loads.items()))
    finally:
        engine = None
        gc.collect()
        shutil.rmtree(nvme, ignore_errors=True)


def p__selftest_timeout(ctx, rec):
    """(tests only) a Python loop past its limit: SIGALRM stops it."""
    while True:
        time.sleep(0.05)


def p__selftest_hang(ctx, rec):
    """(tests only) stuck where SIGALRM cannot reach (the signal blocked, as inside C code that
    retries on EINTR): the watchdog thread records it and re-executes the process."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(3600)


SELFTESTS = ["_selftest_timeout", "_selftest_hang"]
FUNCS = {name: globals()["p_" + name] for name in PATHS + SELFTESTS}


# -------------------------------------------------------------------------------------------------
# running


def prebuild(args, names) -> dict:
    """Build the ops of ``names`` in parallel subprocesses; returns per op status and seconds."""
    ops = sorted({op for n in names for op in OPS_OF.get(n, {}).get(args.device, [])})
    if not ops:
        return {}
    env = dict(os.environ, MAX_JOBS=str(max(2, (os.cpu_count() or 2) // max(1, len(ops)))))
    procs, t0 = {}, time.time()
    for op in ops:
        procs[op] = (subprocess.Popen([sys.executable, "-m", "dslaunch.kernels.builder", op],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True), time.time())
    out = {}
    for op, (p, started) in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1, args.prebuild_timeout - (time.time() - t0)))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            text, rc = (p.communicate()[0] or "") + "\n(prebuild timeout)", -9
        status = "".join(text.strip().splitlines()[-1:]) if text.strip() else ""
        out[op] = {"rc": rc, "seconds": round(time.time() - started, 1), "status": status[-400:]}
        print(f"[cuda_paths] prebuild {op:18s} rc {rc} {out[op]['seconds']:6.1f}s {status[:160]}",
              flush=True)
    out["_wall_s"] = round(time.time() - t0, 1)
    return out


def cuda_healthy() -> str | None:
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def reexec(args):
    argv = [sys.executable, str(Path(__file__).resolve())] + [
        a for a in sys.argv[1:] if a not in ("--resume", "--prebuild")] + ["--resume"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def path_limit(args, name, results):
    """The path's limit, cut to what is left of ``--budget`` (None: no time left for it)."""
    limit = LIMITS.get(name, args.limit) if args.limit_override is None else args.limit_override
    if args.budget:
        left = args.budget - (time.time() - results.data["meta"]["started"])
        if left < min(limit, 20):
            return None
        limit = int(min(limit, left))
    return limit


def out_of_budget(name, results):
    rec = {"status": "skipped", "seconds": 0.0, "reason": "--budget spent before this path"}
    results.put(name, rec)
    line(name, rec)


def run_in_process(ctx, name, results):
    limit = path_limit(ctx.args, name, results)
    if limit is None:
        return out_of_budget(name, results)
    rec = {"status": "running", "limit_s": limit}
    started = time.perf_counter()
    main_ident = threading.main_thread().ident
    finished = threading.Event()

    def on_alarm(signum, frame):
        raise PathTimeout(f"over the {limit}s limit")

    def hard_watchdog():
        if finished.wait(limit + ctx.args.grace):
            return
        frame = sys._current_frames().get(main_ident)
        stack = "".join(traceback.format_stack(frame)[-12:]) if frame else ""
        hung = {"status": "timeout", "seconds": round(time.perf_counter() - started, 1),
                "limit_s": limit, "error": f"hung over {limit}+{ctx.args.grace}s (inside C code: "
                "SIGALRM did not stop it); process re-executed for the next paths",
                "stack_tail": stack[-4000:]}
        results.put(name, hung)
        line(name, hung)
        reexec(ctx.args)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    threading.Thread(target=hard_watchdog, daemon=True).start()
    try:
        summary = FUNCS[name](ctx, rec)
        rec["status"], rec["summary"] = "ok", summary
    except Skip as exc:
        rec["status"], rec["reason"] = "skipped", str(exc)
    except PathTimeout as exc:
        rec["status"], rec["error"] = "timeout", str(exc)
        rec["traceback_tail"] = traceback.format_exc()[-3000:]
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
        rec["traceback_tail"] = traceback.format_exc()[-3000:]
    finally:
        signal.alarm(0)
        finished.set()
        signal.signal(signal.SIGALRM, old)
    rec["seconds"] = round(time.perf_counter() - started, 2)
    gc.collect()
    if ctx.cuda:
        import torch

        broken = cuda_healthy()
        if broken:
            rec["cuda_broken_after"] = broken
        else:
            rec["peak_memory_mb"] = torch.cuda.max_memory_allocated() >> 20
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        results.put(name, rec)
        line(name, rec)
        if broken:
            print(f"[cuda_paths] CUDA context broken after {name} ({broken}): re-executing",
                  flush=True)
            reexec(ctx.args)
        return
    results.put(name, rec)
    line(name, rec)


def run_isolated(args, name, results):
    out = Path(tempfile.mkdtemp(prefix="cuda_path_")) / "one.json"
    limit = path_limit(args, name, results)
    if limit is None:
        return out_of_budget(name, results)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--device", args.device, "--paths", name,
           "--out", str(out), "--limit", str(limit), "--grace", str(args.grace),
           "--nvme-dir", args.nvme_dir] + [f"--{k.replace('_', '-')}={getattr(args, k)}"
                                           for k in ("seq_len", "n_layer", "n_head", "d_model",
                                                     "micro")]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, timeout=limit + 2 * args.grace + 60, capture_output=True,
                           text=True)
        sys.stdout.write("".join(ln for ln in p.stdout.splitlines(True)
                                 if not ln.startswith("[cuda_paths] ")))
        rec = json.loads(out.read_text())["paths"].get(name) if out.exists() else None
        if rec is not None and rec.get("status") == "running":
            rec = None
        if rec is None:
            rec = {"status": "failed", "error": f"subprocess rc {p.returncode}, no result",
                   "traceback_tail": (p.stdout + p.stderr)[-3000:]}
    except subprocess.TimeoutExpired as exc:
        rec = {"status": "timeout", "error": "subprocess killed at the outer limit",
               "traceback_tail": str(exc.stdout or "")[-3000:]}
    rec["seconds_with_process"] = round(time.perf_counter() - t0, 2)
    results.put(name, rec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma list of: {', '.join(PATHS)}")
    ap.add_argument("--out", default="cuda_paths.json")
    ap.add_argument("--limit", type=int, default=120, help="seconds per path (some have more)")
    ap.add_argument("--limit-override", type=int, default=None, help="one limit for every path")
    ap.add_argument("--grace", type=int, default=30, help="seconds past the limit before the "
                    "watchdog gives up on the path and re-executes the process")
    ap.add_argument("--budget", type=int, default=None, help="seconds for the whole run (from "
                    "the start, prebuild included): limits shrink to fit, later paths are skipped")
    ap.add_argument("--prebuild", action="store_true", help="build the paths' ops first, in parallel")
    ap.add_argument("--prebuild-timeout", type=int, default=420)
    ap.add_argument("--isolate", action="store_true", help="each path in its own subprocess")
    ap.add_argument("--nvme-dir", default="/tmp/nvme")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--flops-model", choices=("auto", "small", "bench"), default="auto",
                    help="flops_profiler's model: the small one, or examples/gpt.py's "
                    "bench_config (27M, micro 16); auto: bench on CUDA, small on CPU")
    ap.add_argument("--resume", action="store_true", help="(internal) keep the JSON's results and "
                    "run only the paths it lacks")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.paths.split(",") if n.strip()]
    unknown = [n for n in names if n not in FUNCS]
    if unknown:
        ap.error(f"unknown paths {unknown}; known: {PATHS}")
    names = [n for n in SELFTESTS + PATHS if n in names]
    os.environ["DSLAUNCH_ACCELERATOR"] = args.device
    faulthandler.enable()
    # a re-executed process inherits the signal mask of the thread that re-executed it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    meta = {"device": args.device, "started": time.time(), "torch": torch.__version__,
            "python": sys.version.split()[0], "argv": sys.argv[1:], "cpus": os.cpu_count(),
            "model": {k: getattr(args, k) for k in ("seq_len", "n_layer", "n_head", "d_model",
                                                     "micro")}, "steps": STEPS}
    if args.device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
        meta["cuda"] = torch.version.cuda
    results = Results(Path(args.out), meta, args.resume)
    results.write()
    if args.budget:  # the builds may take at most half of the run's time
        args.prebuild_timeout = min(args.prebuild_timeout, max(30, args.budget // 2))
    if args.prebuild and not args.resume:
        results.data["prebuild"] = prebuild(args, names)
        results.write()
    done = set(results.data["paths"]) if args.resume else set()
    t0 = time.time()
    if args.isolate:
        for name in names:
            if name not in done:
                run_isolated(args, name, results)
                line(name, results.data["paths"][name])
    else:
        ctx = Ctx(args)
        for name in names:
            if name not in done:
                run_in_process(ctx, name, results)
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    results.write()
    s = results.data["summary"]
    print(f"[cuda_paths] done in {time.time() - t0:.1f}s (total {results.data['meta']['elapsed_s']}s"
          f"): ok {len(s['ok'])}, failed {s['failed']}, skipped {s['skipped']}, "
          f"timeout {s['timeout']} -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
