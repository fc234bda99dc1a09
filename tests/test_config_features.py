"""Config sections DeepSpeed 0.19 scripts use, each proven on 2 ranks (gloo) against a
single-process torch reference on the same tiny model and data (tests/scripts/tiny_mlp.py):
``gradient_allreduce_op``, ``managed_gradient_accumulation``, ``torch_autocast``,
``bf16.bf16_master_weights_and_grads`` / ``bf16.bf16_optimizer_states``. The rank side is
tests/scripts/config_features.py; each ``--mode`` is one cached job."""

import sys

import pytest
import torch

from helpers import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
from tiny_mlp import batch, model

WORLD = 2


def _job(job_cache, mode):
    return job_cache.run(f"cfgfeat-{mode}", "config_features.py", "--mode", mode,
                         "--out", "{dir}/out", nproc=WORLD).results(WORLD, "out")


def _params(m) -> dict:
    return {n: p.detach().float().reshape(-1) for n, p in m.named_parameters()}


def _close(got: dict, want: dict, atol: float) -> bool:
    return all(torch.allclose(torch.tensor(got[n]), want[n], rtol=0, atol=atol) for n in want)


# -- gradient_allreduce_op ------------------------------------------------------------------------

def _sgd_reference(reduce: str, steps: int = 2, lr: float = 0.1):
    """Plain SGD where each step's gradient is the sum (or mean) of the ranks' gradients."""
    m = model()
    losses = []
    for step in range(steps):
        grads = None
        for rank in range(WORLD):
            m.zero_grad()
            loss = m(*batch(step, 0, rank))
            loss.backward()
            if rank == 0:
                losses.append(loss.item())
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        with torch.no_grad():
            for p, g in zip(m.parameters(), grads):
                p.sub_(lr * (g if reduce == "sum" else g / WORLD))
    return losses, _params(m)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gradient_allreduce_op_sum_steps_world_size_times_the_mean(job_cache, stage):
    res = _job(job_cache, "reduce")
    ref_losses, ref_sum = _sgd_reference("sum")
    _, ref_mean = _sgd_reference("mean")
    got = res[0][f"sum_stage{stage}"]
    assert got["losses"] == pytest.approx(ref_losses, abs=1e-6)
    assert _close(got["params"], ref_sum, atol=1e-6)
    assert not _close(got["params"], ref_mean, atol=1e-3)  # the mean would be far off
    assert res[1][f"sum_stage{stage}"]["params"] == got["params"]


# -- managed_gradient_accumulation: false ----------------------------------------------------------

def _unmanaged_reference(backwards=(1, 3, 2), gas=2):
    """AdamW; before each step the caller ran ``n`` backwards of loss / gas per rank; the step
    uses the rank-mean of those accumulated gradients."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step, n in enumerate(backwards):
        grads, step_losses = None, []
        for rank in range(WORLD):
            m.zero_grad()
            for micro in range(n):
                loss = m(*batch(step, micro, rank))
                (loss / gas).backward()
                if rank == 0:
                    step_losses.append(loss.item())
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(m.parameters(), grads):
            p.grad = g / WORLD
        opt.step()
        losses.append(step_losses)
    return losses, _params(m)


@pytest.mark.parametrize("case", ["unmanaged_stage0", "unmanaged_stage0_overlap",
                                  "unmanaged_stage1", "unmanaged_stage2", "unmanaged_stage3"])
def test_unmanaged_accumulation_steps_at_every_step_call(job_cache, case):
    res = _job(job_cache, "reduce")
    ref_losses, ref_params = _unmanaged_reference()
    got = res[0][case]
    assert len(got["losses"]) == 3 and [len(s) for s in got["losses"]] == [1, 3, 2]
    for g, r in zip(got["losses"], ref_losses):
        assert g == pytest.approx(r, abs=1e-6)
    assert _close(got["params"], ref_params, atol=1e-6)
    assert res[1][case]["params"] == got["params"]
    # DeepSpeed's counters: one step per step() call, samples = micro-batches really seen
    assert got["global_steps"] == 3
    assert got["global_samples"] == [4, 16, 24]  # micro-batch 2 x 2 ranks x (1, 3, 2) backwards
    assert got["boundary_in_backward"] == [False] * 6 and got["managed"] is False
    assert "managed_gradient_accumulation: false" in got["set_boundary_refused"]
