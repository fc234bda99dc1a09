"""``engine.offload_states()`` / ``reload_states()`` (dslaunch/engine/zero/offload_states.py), in
this process (world size 1): DeepSpeed 0.19's signature and refusals, training refused while the
states are away, and training after the round trip equal to training without it, in every ZeRO
stage. On a CUDA machine the states really leave the GPU (memory_allocated drops to the
untouched kinds) and come back to the same values."""

import pytest
import torch

import dslaunch
from dslaunch.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

CUDA = torch.cuda.is_available()


def _engine(stage, bf16=False, optimizer=True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 8))
    cfg = {"train_batch_size": 4, "zero_optimization": {"stage": stage,
                                                        "stage3_param_persistence_threshold": 0},
           "bf16": {"enabled": bf16}}
    if optimizer:
        cfg["optimizer"] = {"type": "Adam", "params": {"lr": 1e-2}}
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    return engine


def _steps(engine, n, start=0):
    losses = []
    for i in range(start, start + n):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 64, generator=g), torch.randn(4, 8, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)).float(),
                                            y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stage,bf16", [(0, False), (1, True), (2, False), (3, True)])
def test_training_after_offload_and_reload_equals_training_without(stage, bf16):
    want = _steps(_engine(stage, bf16), 4)
    e = _engine(stage, bf16)
    got = _steps(e, 2)
    e.offload_states(include=[OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.hp_params],
                     device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False)
    with pytest.raises(RuntimeError, match=r"hp_params, optim_states\) are offloaded; call "
                                           r"engine.reload_states\(\) first"):
        e(torch.zeros(4, 64, device=e.device))
    e.reload_states(non_blocking=False)
    e.optimizer.offload_states()  # OpenRLHF's spelling: on the optimizer, every kind
    e.optimizer.reload_states()
    got += _steps(e, 2, start=2)
    assert got == want


def test_refusals_as_deepspeed():
    e = _engine(3, optimizer=False)
    with pytest.raises(ValueError, match="without an optimizer"):
        e.offload_states()
    with pytest.raises(ValueError, match="without an optimizer"):
        e.reload_states()
    e = _engine(1)
    with pytest.raises(ValueError, match="'nvme' is not supported"):
        e.offload_states(device=OffloadDeviceEnum.nvme)
    with pytest.warns(UserWarning, match="nothing moved"):
        e.offload_states(device="none")
    _steps(e, 1)  # nothing was offloaded: training goes on


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: on a CPU host the states stay put")
@pytest.mark.parametrize("stage", [1, 3])
def test_states_leave_the_gpu_and_come_back(stage):
    want = _steps(_engine(stage, bf16=True), 4)
    e = _engine(stage, bf16=True)
    assert e.device.type == "cuda"
    got = _steps(e, 2)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    e.offload_states(include=[OffloadStateTypeEnum.optim_states])
    after_optim = torch.cuda.memory_allocated()
    assert after_optim < before  # the moments left the GPU
    e.offload_states()  # and every other kind
    assert torch.cuda.memory_allocated() < after_optim
    assert all(t.device.type == "cpu" for t in e.optimizer.state[e.optimizer.param_groups[0]
                                                                ["params"][0]].values()
               if isinstance(t, torch.Tensor) and t.dim())
    e.reload_states()
    assert torch.cuda.memory_allocated() == before
    got += _steps(e, 2, start=2)
    assert got == want


def test_a_moved_storage_keeps_its_views_views():
    """The mechanism on its own (the part a CPU host never needs): a flat buffer and the .grad
    view into it, moved to a new storage, stay one buffer, no longer the old one."""
    from dslaunch.engine.zero.offload_states import _move, _repoint

    flat = torch.arange(6.)
    p = torch.nn.Parameter(torch.zeros(2, 2))
    p.grad = flat[2:6].view(2, 2)
    old = flat.untyped_storage()
    new = _move(old, torch.device("cpu"), pin=False, non_blocking=False)
    for t in (flat, p.grad):
        _repoint(t, new)
    ptr = flat.untyped_storage().data_ptr()
    assert ptr == new.data_ptr() != old.data_ptr()
    assert p.grad.untyped_storage().data_ptr() == ptr and p.grad.storage_offset() == 2
    flat.add_(10)
    assert p.grad.tolist() == [[12., 13.], [14., 15.]] and p.grad.shape == (2, 2)
