"""ZeRO-Offload's pipelined data path (dslaunch/engine/zero/offload_pipeline.py), in this process
(world size 1; the 2- and 4-rank jobs are in test_zero_train.py): the fused step (gradient scale
and 16-bit copy inside the CPU optimizer's pass, chunk-wise uploads) trains bit for bit like the
plain one (scale the gradient, step, convert), with gradient accumulation (the first micro-step
copies into the host shard, the next ones add) and clipping. On a CPU host the side streams are
no-ops; the same code queues real copies on a GPU."""

import pytest
import torch

import dslaunch
from dslaunch.engine.optim.cpu_adam import DSCPUAdam
from dslaunch.engine.zero.offload_pipeline import HostOffload, optimizer_threads


def _engine(stage, bf16, gas):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 8))
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
           "gradient_clipping": 0.5, "bf16": {"enabled": bf16},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000,
                                 "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    return engine


def _train(engine, steps, gas):
    losses = []
    for i in range(steps * gas):
        g = torch.Generator().manual_seed(i % gas)  # the same batches every step: loss falls
        x, y = torch.randn(4, 64, generator=g), torch.randn(4, 8, generator=g)
        x, y = x.to(engine.device), y.to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in engine.module.parameters()]


@pytest.mark.parametrize("stage,bf16,gas", [(2, True, 2), (2, False, 1), (1, True, 2)])
def test_fused_offloaded_step_equals_the_plain_one(stage, bf16, gas, monkeypatch):
    e = _engine(stage, bf16, gas)
    assert e.strategy.host is not None and HostOffload.fuses(e.strategy.optimizer)
    if e.device.type == "cuda":  # real side streams and page-locked host buffers
        assert e.strategy.host.to_host is not None
        assert all(g.grad_shard.is_pinned() and g.master.is_pinned() for g in e.strategy.groups)
    got, got_params = _train(e, 5, gas)
    monkeypatch.setattr(HostOffload, "fuses", staticmethod(lambda optimizer: False))
    want, want_params = _train(_engine(stage, bf16, gas), 5, gas)
    assert got == want
    for a, b in zip(got_params, want_params):
        assert torch.equal(a, b)
    assert got[-1] < got[0]


def test_cpu_adam_step_with_scale_copy_out_and_callback():
    torch.manual_seed(1)
    base = [torch.randn(1000) for _ in range(3)]
    grads = [torch.randn(1000) for _ in range(3)]

    def opt():
        ps = [torch.nn.Parameter(b.clone()) for b in base]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps, DSCPUAdam(ps, lr=1e-2, weight_decay=0.01)

    ps, o = opt()
    outs = {p: torch.empty(1000, dtype=torch.bfloat16) for p in ps}
    seen = []
    o.step(grad_scale=0.25, copy_outs=outs, on_updated=seen.append, threads=1)
    ref_ps, ref = opt()
    for p in ref_ps:
        p.grad.mul_(0.25)
    ref.step()
    assert seen == ps
    for p, r in zip(ps, ref_ps):
        assert torch.equal(p, r)
        assert torch.equal(outs[p], r.detach().to(torch.bfloat16))


def test_optimizer_threads_take_the_ranks_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert optimizer_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert optimizer_threads() == 1
