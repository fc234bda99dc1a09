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


MODES = ("reduce", "autocast", "bf16")


def _job(job_cache, mode):
    """The ``--mode`` job's per-rank records; the first asked for starts the three modes in one
    launch (JobCache.run_many: one after the other in the same ranks)."""
    job_cache.run_many("cfgfeat", "config_features.py", {
        f"cfgfeat-{m}": (("--mode", m, "--out", "{dir}/out"), None) for m in MODES}, nproc=WORLD)
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


# -- torch_autocast ---------------------------------------------------------------------------------

def _autocast_reference(autocast: bool, steps: int = 3):
    """fp32 model and AdamW; forward under torch.autocast(cpu, bf16) as the engine runs it; each
    step's gradient the fp32 mean of the ranks' gradients."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(steps):
        grads = None
        for rank in range(WORLD):
            m.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = m(*batch(step, 0, rank))
            loss.backward()
            if rank == 0:
                losses.append(loss.item())
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(m.parameters(), grads):
            p.grad = g / WORLD
        opt.step()
    return losses, _params(m)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_torch_autocast_matches_torch_autocast_reference(job_cache, stage):
    res = _job(job_cache, "autocast")
    got, plain = res[0][f"autocast_stage{stage}"], res[0][f"fp32_stage{stage}"]
    ref_losses, ref_params = _autocast_reference(True)
    fp32_losses, _ = _autocast_reference(False)
    # inside forward the Linear really ran in bf16; the parameters stayed fp32
    assert got["seen_dtypes"] == ["torch.bfloat16"] and plain["seen_dtypes"] == ["torch.float32"]
    assert got["param_dtypes"] == ["torch.float32"]
    # The first forward sees the same weights as the reference: the same bf16 loss, and not the
    # fp32 one (autocast moves it by ~2e-3).
    assert got["losses"][0] == pytest.approx(ref_losses[0], abs=1e-6)
    assert abs(got["losses"][0] - fp32_losses[0]) > 1e-3
    # Later steps: weights that differ in the last fp32 bit (the ranks' gradients summed in
    # another order; at stages 1-3 the Linear gradients also reduced in bf16) can round an
    # activation to the neighbouring bf16 value, which moves a loss by up to ~1e-3 (seen: 7e-4 at
    # step 3) and AdamW's next update by ~1e-4 (seen: 1.7e-4). Bounds: losses 1.5e-3, weights 5e-4.
    assert got["losses"] == pytest.approx(ref_losses, abs=1.5e-3)
    assert _close(got["params"], ref_params, atol=5e-4)
    assert res[1][f"autocast_stage{stage}"]["params"] == got["params"]
    if stage == 0:
        assert got["grad_bytes"] == plain["grad_bytes"]
    else:  # the Linear gradients crossed the wire in 2 bytes, the LayerNorm's in 4
        assert got["grad_bytes"] < plain["grad_bytes"]


def test_torch_autocast_bad_module_name_names_the_key():
    from dslaunch.config import resolve_config
    from dslaunch.engine.base.autocast import Autocast

    cfg = resolve_config({"train_batch_size": 2, "torch_autocast": {
        "enabled": True, "lower_precision_safe_modules": ["torch.nn.Linaer"]}}, world_size=1)
    with pytest.raises(ValueError, match=r"torch_autocast.lower_precision_safe_modules: cannot "
                                         r"import 'torch.nn.Linaer'"):
        Autocast(cfg.typed.torch_autocast, "cpu")
    custom = Autocast(resolve_config({"train_batch_size": 2, "torch_autocast": {
        "enabled": True, "lower_precision_safe_modules": ["torch.nn.LayerNorm"]}},
        world_size=1).typed.torch_autocast, "cpu")
    m = model()
    assert custom.mark(m) == 2 and custom.dtype == torch.bfloat16
    from dslaunch.engine.base.autocast import comm_dtype
    assert comm_dtype(m.norm.weight) == torch.bfloat16 and comm_dtype(m.fc1.weight) is None


# -- bf16.bf16_master_weights_and_grads / bf16_optimizer_states ------------------------------------

def _bf16_reference(fp32_states: bool, steps: int = 3):
    """A bf16 model whose gradients are the bf16 mean of the ranks' bf16 gradients. bf16 states:
    torch's AdamW (fused, as the engine builds it) steps the bf16 parameters themselves. fp32
    states (the CPU Adam's): AdamW steps fp32 copies, rounded to the bf16 weights each step."""
    m = model().to(torch.bfloat16)
    shadow = [p.detach().float().requires_grad_(True) for p in m.parameters()]
    opt = torch.optim.AdamW(shadow if fp32_states else m.parameters(), lr=1e-2,
                            weight_decay=0.1, fused=True)
    losses = []
    for step in range(steps):
        grads = None
        for rank in range(WORLD):
            m.zero_grad()
            loss = m(*[t.to(torch.bfloat16) for t in batch(step, 0, rank)])
            loss.backward()
            if rank == 0:
                losses.append(loss.item())
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        grads = [g * 0.5 for g in grads]
        if fp32_states:
            for s_, g in zip(shadow, grads):
                s_.grad = g.float()
            opt.step()
            with torch.no_grad():
                for p, s_ in zip(m.parameters(), shadow):
                    p.copy_(s_)
                    s_.copy_(p)
        else:
            for p, g in zip(m.parameters(), grads):
                p.grad = g
            opt.step()
    return losses, _params(m)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_master_weights_and_optimizer_states_stay_bf16(job_cache, stage):
    res = _job(job_cache, "bf16")
    lean, plain = res[0][f"lean_stage{stage}"], res[0][f"bf16_stage{stage}"]
    ref_losses, ref_params = _bf16_reference(fp32_states=False)
    # the same bf16 arithmetic as torch on one process: equal (seen: bit for bit)
    assert lean["losses"] == pytest.approx(ref_losses, abs=1e-6)
    assert _close(lean["params"], ref_params, atol=1e-6)
    assert lean["params"] != plain["params"]  # fp32 masters train differently
    assert res[1][f"lean_stage{stage}"]["params"] == lean["params"]
    # no fp32 anywhere in the optimizer: bf16 states and no fp32 master copy, so its bytes are
    # about 4 per element instead of 12 (fp32 master + two fp32 states)
    assert lean["state_dtypes"] == ["torch.bfloat16"] and plain["state_dtypes"] == ["torch.float32"]
    assert lean["memory"]["optimizer"]["cpu"] < 0.36 * plain["memory"]["optimizer"]["cpu"]
    assert lean["memory"]["grads"]["cpu"] <= plain["memory"]["grads"]["cpu"]


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("states", ["fp32", "bf16"])
def test_bf16_master_weights_offloaded_to_the_cpu_adam(job_cache, stage, states):
    res = _job(job_cache, "bf16")
    name = "lean_offload" if states == "fp32" else "lean_offload_bf16states"
    got = res[0][f"{name}_stage{stage}"]
    ref_losses, ref_params = _bf16_reference(fp32_states=True)
    dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}[states]
    assert got["optimizer"] == "DSCPUAdam" and got["state_dtypes"] == [dtype]
    # the compiled op and torch sum in another order (and bf16 states round where the reference
    # keeps fp32): a weight may round to the neighbouring bf16 value (2**-7 relative), which
    # moves a later loss by ~1e-3 and so AdamW's next steps (each about lr = 1e-2) by a little:
    # seen up to 1e-3 on weights after 3 steps; bounds: one bf16 ulp + 2e-3, losses 1.5e-3
    for n, want in ref_params.items():
        assert torch.allclose(torch.tensor(got["params"][n]), want, rtol=2**-7, atol=2e-3), n
    assert got["losses"][0] == pytest.approx(ref_losses[0], abs=1e-6)
    assert got["losses"] == pytest.approx(ref_losses, abs=1.5e-3)
    fp32_opt = res[0][f"lean_offload_stage{stage}"]["memory"]["optimizer"]["cpu"]
    bf16_opt = res[0][f"lean_offload_bf16states_stage{stage}"]["memory"]["optimizer"]["cpu"]
    assert bf16_opt < fp32_opt  # bf16 states take half the bytes of fp32 ones


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_bf16_master_weights_checkpoint_resumes_exactly(job_cache, stage):
    got = _job(job_cache, "bf16")[0][f"lean_resume_stage{stage}"]
    assert got["resumed"] == got["third"] and got["resumed_params"] == got["params"]
    assert got["state_dtypes"] == ["torch.bfloat16"]  # loaded states stay bf16

# -- what the config refuses, naming the key ---------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    ({"torch_autocast": {"enabled": True}, "fp16": {"enabled": True}},
     "torch_autocast.enabled: cannot be combined with fp16.enabled"),
    ({"torch_autocast": {"enabled": True, "dtype": "fp16"}},
     "torch_autocast.dtype: \"fp16\" is not supported yet"),
    ({"torch_autocast": {"enabled": True, "lower_precision_safe_modules": "torch.nn.Linear"}},
     "torch_autocast.lower_precision_safe_modules: \"torch.nn.Linear\" is not a list"),
    ({"torch_autocast": {"enabled": True}, "pipeline": {"stages": 2}},
     "torch_autocast.enabled: not supported with pipeline parallelism"),
    ({"managed_gradient_accumulation": False, "pipeline": {"stages": 2}},
     "managed_gradient_accumulation: false is not supported with pipeline parallelism"),
    ({"gradient_allreduce_op": "sum", "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}},
     "gradient_allreduce_op: \"sum\" cannot be used with OneBitAdam"),
    ({"gradient_allreduce_op": "avg"}, "gradient_allreduce_op: \"avg\" is not allowed; expected "
                                       "one of 'mean', 'sum'"),
    ({"bf16": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}},
     "bf16.bf16_master_weights_and_grads: needs bf16.enabled true"),
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True}},
     "bf16.bf16_optimizer_states: needs bf16.bf16_master_weights_and_grads true"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
      "zero_optimization": {"stage": 2}},
     "bf16.bf16_master_weights_and_grads: keeping fp32 optimizer states for bf16 master weights "
     "needs zero_optimization.offload_optimizer.device \"cpu\""),
])
def test_config_refuses_what_cannot_run(extra, message):
    from dslaunch.config import ConfigError, resolve_config

    with pytest.raises(ConfigError) as err:
        resolve_config({"train_micro_batch_size_per_gpu": 2, **extra}, world_size=2)
    assert message in str(err.value)
