"""ZeRO-Inference (issue 31 part 3) and ZeRO-3 ``offload_param: cpu`` fetches (part 2) on the CPU.

- examples/zero_inference.py, run for real under ``dslaunch run --as-deepspeed`` (``import
  deepspeed`` is dslaunch): a tiny Transformers Llama (bf16) and GPT-2 (tied embedding, fp32),
  ZeRO-3 with the parameters offloaded, ``initialize`` without an optimizer, ``generate()`` on
  ``engine.module``: the greedy tokens equal ``generate()`` on the plain, unsharded model, and
  between passes every parameter is partitioned (``NOT_AVAILABLE``, no storage) with its shard on
  the host.
- In process: the forward-only stage-3 strategy with ``offload_param: cpu`` keeps its shards in a
  ``HostParamStore``, holds no full buffer at rest, prefetches along the recorded module order
  (asynchronous fetches after the first pass; NullStream / NullEvent here, CUDA streams on a GPU)
  and computes what the plain model computes; the training engine in eval mode prefetches too.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn

import dslaunch
from dslaunch.engine.zero.stage3_fetch import IN_FLIGHT, HostParamStore
from helpers import DSLAUNCH, ROOT

EXAMPLE = ROOT / "examples" / "zero_inference.py"
CONFIG = ROOT / "configs" / "zero_inference.json"


def _config(tmp_path, **zero):
    cfg = json.loads(CONFIG.read_text())
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 10  # tiny: partition all
    cfg["zero_optimization"].update(zero)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("arch,dtype", [("llama", "bf16"), ("gpt2", "fp32")])
def test_example_generates_like_plain_transformers(tmp_path, arch, dtype):
    import subprocess

    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "DSLAUNCH_CONFIG", "DSLAUNCH_AS_DEEPSPEED")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in [env.get("PYTHONPATH")] if x])
    cmd = [*DSLAUNCH, "run", "--as-deepspeed", "--nproc-per-node", "1", "--omp-threads", "1",
           str(EXAMPLE), "--config", str(_config(tmp_path)), "--arch", arch, "--dtype", dtype,
           "--hidden", "64", "--layers", "2", "--heads", "4", "--vocab", "512", "--batch", "2",
           "--prompt-len", "8", "--new-tokens", "6", "--prefill-iters", "1", "--check",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["runtime"] == "dslaunch"
    assert r["match"], (r["tokens"], r["reference_tokens"])
    assert len(r["tokens"]) == 2 and all(len(t) == 6 for t in r["tokens"])
    for rest in (r["at_rest_before"], r["at_rest_after"]):
        assert rest["status"] == {"NOT_AVAILABLE": rest["params"]}, rest
        assert rest["param_storage_bytes"] == 0, rest
        assert rest["ds_tensor_devices"] == ["cpu"], rest
    assert r["prefill_tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0


class _Net(nn.Module):
    def __init__(self, d=16, n=4):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.GELU()) for _ in range(n))
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.out(x)


def _zero3(offload=True, **zero):
    z = {"stage": 3, "stage3_param_persistence_threshold": 0,
         "stage3_prefetch_bucket_size": 600, **zero}
    if offload:
        z["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": z}


def _count_async(store):
    calls = []
    orig = store._all_gather

    def spy(key, full, async_op, exact=False):
        calls.append(async_op)
        return orig(key, full, async_op, exact)
    store._all_gather = spy
    return calls


def test_forward_only_offload_prefetches_and_matches_plain():
    torch.manual_seed(0)
    model = _Net()
    plain = _Net()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(5, 16)
    with torch.no_grad():
        want = plain(x)
    engine, *_ = dslaunch.initialize(model=model, config=_zero3())
    store = engine.strategy.store
    assert isinstance(store, HostParamStore)
    assert all(t.device.type == "cpu" for t in store.local_shards())
    # at rest no bucket has storage on the device (none is persistent here)
    assert all(t.untyped_storage().nbytes() == 0 for t in store.full.values())
    calls = _count_async(store)
    seen = []
    orig_wait = store.wait

    def wait(key):
        seen.append(store.state[key] == IN_FLIGHT)
        return orig_wait(key)
    store.wait = wait
    with torch.no_grad():
        first = engine.module(x)
        n_first = len(calls)
        assert not any(calls)  # the first pass records the order: nothing prefetched
        for _ in range(2):
            again = engine.module(x)
    assert torch.equal(first, want) and torch.equal(again, want)
    later = calls[n_first:]
    assert any(later), "no prefetch along the recorded order"
    assert any(seen), "no prefetched unit was waited for"
    assert all(t.untyped_storage().nbytes() == 0 for t in store.full.values())
    assert store.h2d_bytes > 0


def test_training_engine_offload_prefetches_in_eval():
    torch.manual_seed(1)
    model = _Net()
    cfg = _zero3(offload_optimizer={"device": "cpu"})
    cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    store = engine.strategy.store
    assert isinstance(store, HostParamStore)
    x = torch.randn(4, 16)
    loss = engine(x).pow(2).mean()  # records the order
    engine.backward(loss)
    engine.step()
    engine.eval()
    calls = _count_async(store)
    with torch.no_grad():
        engine(x)
    assert any(calls), "evaluation after a recorded pass should prefetch"


def _train_losses(cfg, steps=4):
    torch.manual_seed(2)
    model = _Net()
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 16, generator=g)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


def test_zero_infinity_cpu_trains_like_no_offload():
    """ZeRO-3 with parameters and optimizer on the host (gradients through the offload pipeline,
    the CPU step writing the host shard): the losses of ZeRO-3 without offload."""
    opt = {"type": "AdamW", "params": {"lr": 1e-2}}
    base = {**_zero3(offload=False), "optimizer": opt, "gradient_clipping": 1.0}
    off = {**_zero3(offload_optimizer={"device": "cpu"}), "optimizer": opt,
           "gradient_clipping": 1.0}
    _, want = _train_losses(base)
    engine, got = _train_losses(off)
    assert isinstance(engine.strategy.store, HostParamStore)
    assert engine.strategy.host is not None
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
