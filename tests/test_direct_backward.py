"""PyTorch-style backward (dslaunch/engine/core/direct_backward.py): ``loss.backward()`` on the
engine's output trains exactly as ``engine.backward(loss)`` does, on 2 ranks with accumulation
and clipping, in every ZeRO stage (tests/scripts/direct_backward.py); under fp16 through
``engine.scale(loss).backward()``, and a plain ``loss.backward()`` there is refused.

Without the engine's output hooks a direct backward skips the reduction: on 2 ranks at stage 0 the
ranks' weights drift apart (measured: 0.053 from the engine.backward run after 3 steps)."""

import pytest
import torch

import dslaunch
from helpers import results


def _args(fp16):
    return ["--out", "{dir}/out"] + (["--fp16", "--stages", "0,3"] if fp16 else [])


@pytest.mark.parametrize("fp16", [False, True])
def test_loss_backward_trains_as_engine_backward(job_cache, fp16):
    # the fp32 and fp16 jobs in one launch (JobCache.run_many: one after the other in the ranks)
    job_cache.run_many("direct-backward", "direct_backward.py",
                       {f"direct-backward-{f}": (_args(f), None) for f in (False, True)}, nproc=2)
    job = job_cache.run("direct-backward", "direct_backward.py", *_args(fp16), nproc=2,
                        check=False)
    assert job.ok, job.log[-3000:]
    ranks = results(job.dir / "out", 2)
    for stage, runs in ranks[0].items():
        engine, direct = runs["engine"], runs["direct"]
        assert direct["steps"] == engine["steps"] == 3
        assert direct["losses"] == engine["losses"], stage
        assert direct["weights"] == engine["weights"], stage  # bit for bit
        assert ranks[1][stage]["direct"]["weights"] == direct["weights"]  # ranks agree
        assert ranks[1][stage]["direct"]["losses"] != direct["losses"]  # each its own data


def _engine(**extra):
    torch.manual_seed(0)
    cfg = {"train_batch_size": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, **extra}
    engine, *_ = dslaunch.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    return engine


def test_fp16_needs_scale_and_gas_divides_the_gradient():
    e = _engine(fp16={"enabled": True, "initial_scale_power": 4})
    x = torch.ones(2, 4)
    with pytest.raises(RuntimeError, match=r"engine.scale\(loss\).backward\(\)"):
        e(x).float().sum().backward()
    e.destroy()

    e = _engine()  # fp32: a direct backward gets the gradient divided by the 2 accumulation steps
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict({k: v.float() for k, v in e.module.state_dict().items()})
    ref(x).sum().backward()
    e(x).sum().backward()
    torch.testing.assert_close(e.module.weight.grad, ref.weight.grad / 2)
