"""``dslaunch.ops``: DeepSpeed's optimizer classes (DeepSpeedCPUAdam, FusedAdam,
DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion, FusedLamb) as plain torch optimizers, outside
the engine.

Each trains a small model for 50 steps with three param groups (own lr and weight decay each)
and ends within 1e-6 of torch.optim (Adam / AdamW by decay mode, Adagrad) or, for Lion and LAMB,
of a reference written out below step by step; with an LR scheduler too (a group's lr changes
take effect: the group driven to lr 0 stops moving). Also: the call Accelerate makes, a
state_dict round trip (bit-identical resume), DeepSpeed's signatures, set_grad_none, the clear
error for a parameter off the CPU, and the torch fallback when the op cannot be built.
"""

import inspect
import io

import pytest
import torch

from dslaunch.ops.adagrad import DeepSpeedCPUAdagrad
from dslaunch.ops.adam import DeepSpeedCPUAdam, FusedAdam
from dslaunch.ops.lamb import FusedLamb
from dslaunch.ops.lion import DeepSpeedCPULion, FusedLion

STEPS = 50
TOL = 1e-6  # max |ours - reference| over every parameter after STEPS steps


class RefLion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2), one tensor at a time:
    c = b1*m + (1-b1)*g;  p = p - lr*(sign(c) + wd*p);  m = b2*m + (1-b2)*g."""

    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                g = p.grad
                c = b1 * m + (1 - b1) * g
                p.copy_(p * (1 - lr * wd) - lr * torch.sign(c))
                m.copy_(b2 * m + (1 - b2) * g)


class RefLamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, Algorithm 2) with DeepSpeed's trust-ratio clamp, one tensor at a
    time: m, v Adam moments; m^ = m/(1-b1^t), v^ = v/(1-b2^t);
    u = m^/(sqrt(v^)+eps) + wd*p  (m^/sqrt(v^+eps) + wd*p with eps inside the root);
    r = clamp(||p||/||u||, min_coeff, max_coeff), 1 if a norm is 0;  p = p - lr*r*u."""

    def __init__(self, params, lr, betas, eps, weight_decay, eps_inside_sqrt=False,
                 max_coeff=10.0, min_coeff=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      eps_inside_sqrt=eps_inside_sqrt, max_coeff=max_coeff,
                                      min_coeff=min_coeff))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), eps, wd = group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                st["t"] += 1
                g, t = p.grad, st["t"]
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
                m_hat, v_hat = st["m"] / (1 - b1 ** t), st["v"] / (1 - b2 ** t)
                if group["eps_inside_sqrt"]:
                    u = m_hat / torch.sqrt(v_hat + eps) + wd * p
                else:
                    u = m_hat / (torch.sqrt(v_hat) + eps) + wd * p
                w_norm, u_norm = p.norm().item(), u.norm().item()
                r = 1.0
                if w_norm > 0 and u_norm > 0:
                    r = min(max(w_norm / u_norm, group["min_coeff"]), group["max_coeff"])
                p.copy_(p - group["lr"] * r * u)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 17), torch.nn.LayerNorm(17), torch.nn.Tanh(),
                               torch.nn.Linear(17, 3))


def _groups(model):
    """Three groups: matrices (decayed), LayerNorm (own lr, more decay), biases (no decay)."""
    lin, norm, _, out = model
    return [{"params": [lin.weight, out.weight], "weight_decay": 0.05},
            {"params": [norm.weight, norm.bias], "weight_decay": 0.1, "lr": 2e-2},
            {"params": [lin.bias, out.bias], "weight_decay": 0.0, "lr": 5e-3}]


_gen = torch.Generator().manual_seed(1)
DATA = [(torch.randn(32, 13, generator=_gen), torch.randn(32, 3, generator=_gen))
        for _ in range(STEPS)]


def _scheduler(opt):
    """Group 0 halves every 10 steps, group 1 stays, group 2 is driven to lr 0 after 20 steps."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, [lambda s: 0.5 ** (s // 10), lambda s: 1.0, lambda s: 1.0 if s < 20 else 0.0])


def _train(model, opt, steps=range(STEPS), sched=None, on_step=None):
    device = next(model.parameters()).device
    for i in steps:
        x, y = (t.to(device) for t in DATA[i])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()
        if on_step is not None:
            on_step(i)
    return model


def _max_dev(a, b) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def _force_torch_path(monkeypatch, cls):
    """Send CPU parameters down the path CUDA parameters take (torch's fused Adam kernel for
    FusedAdam, torch ops for FusedLion): the code of that path, run here without a GPU."""
    monkeypatch.setattr(cls, "_for_op", lambda self, p: False)


# id -> (ours(params), reference(params), path): lr/betas/eps/decay given explicitly to both
CASES = {
    "DeepSpeedCPUAdam-adamw": (lambda g: DeepSpeedCPUAdam(g, lr=1e-2, weight_decay=0.01),
                               lambda g: torch.optim.AdamW(g, lr=1e-2, weight_decay=0.01), None),
    "DeepSpeedCPUAdam-l2": (lambda g: DeepSpeedCPUAdam(g, lr=1e-2, adamw_mode=False),
                            lambda g: torch.optim.Adam(g, lr=1e-2), None),
    "FusedAdam-adamw": (lambda g: FusedAdam(g, lr=1e-2, betas=(0.8, 0.99), eps=1e-6),
                        lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.8, 0.99), eps=1e-6), None),
    "FusedAdam-l2": (lambda g: FusedAdam(g, lr=1e-2, adam_w_mode=False),
                     lambda g: torch.optim.Adam(g, lr=1e-2), None),
    "FusedAdam-adamw-torchfused": (lambda g: FusedAdam(g, lr=1e-2),
                                   lambda g: torch.optim.AdamW(g, lr=1e-2), FusedAdam),
    "FusedAdam-l2-torchfused": (lambda g: FusedAdam(g, lr=1e-2, adam_w_mode=False),
                                lambda g: torch.optim.Adam(g, lr=1e-2), FusedAdam),
    "DeepSpeedCPUAdagrad": (lambda g: DeepSpeedCPUAdagrad(g, lr=5e-2),
                            lambda g: torch.optim.Adagrad(g, lr=5e-2), None),
    "DeepSpeedCPULion": (lambda g: DeepSpeedCPULion(g, lr=1e-3, betas=(0.9, 0.99)),
                         lambda g: RefLion(g, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0), None),
    "FusedLion": (lambda g: FusedLion(g, lr=1e-3),
                  lambda g: RefLion(g, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0), None),
    "FusedLion-torch": (lambda g: FusedLion(g, lr=1e-3),
                        lambda g: RefLion(g, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0),
                        FusedLion),
    "FusedLamb": (lambda g: FusedLamb(g, lr=1e-2, max_coeff=0.5),
                  lambda g: RefLamb(g, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                    max_coeff=0.5), None),
    "FusedLamb-eps_inside_sqrt": (
        lambda g: FusedLamb(g, lr=1e-2, eps=1e-6, eps_inside_sqrt=True),
        lambda g: RefLamb(g, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                          eps_inside_sqrt=True), None),
}


@pytest.mark.parametrize("with_scheduler", [False, True], ids=["constant-lr", "scheduler"])
@pytest.mark.parametrize("case", list(CASES))
def test_equals_reference_over_50_steps_with_param_groups(case, with_scheduler, monkeypatch):
    ours_of, ref_of, forced = CASES[case]
    if forced is not None:
        _force_torch_path(monkeypatch, forced)
    ours_m, ref_m = _model(), _model()
    ours, ref = ours_of(_groups(ours_m)), ref_of(_groups(ref_m))
    if forced is None and hasattr(ours, "compiled"):
        assert ours.compiled  # the compiled op ran (it is built on this machine)
    frozen = {}

    def at(i):  # group 2 has lr 0 from step 20 on: its parameters must not move
        if with_scheduler and i == 20:
            frozen.update({id(p): p.detach().clone() for p in ours.param_groups[2]["params"]})

    _train(ours_m, ours, sched=_scheduler(ours) if with_scheduler else None, on_step=at)
    _train(ref_m, ref, sched=_scheduler(ref) if with_scheduler else None)
    dev = _max_dev(ours_m, ref_m)
    assert dev <= TOL, f"{case}: max |ours - reference| = {dev:.3g}"
    start = _model()
    assert _max_dev(ours_m, start) > 1e-2  # it did train
    if with_scheduler:
        group = ours.param_groups[0]
        assert group["lr"] == pytest.approx(group["initial_lr"] * 0.5 ** 5, rel=1e-12)
        assert ours.param_groups[2]["lr"] == 0.0
        for p in ours.param_groups[2]["params"]:
            assert torch.equal(p.detach(), frozen[id(p)])


@pytest.mark.parametrize("torch_cls", [torch.optim.AdamW, torch.optim.Adam, torch.optim.Adagrad])
def test_accelerate_call_on_a_torch_optimizers_param_groups(torch_cls):
    """Accelerate (offload_optimizer) swaps the user's torch optimizer for DeepSpeed's CPU one:
    ``DeepSpeedCPUAdam(optimizer.param_groups, lr=, weight_decay=, adamw_mode=)`` (AdamW vs Adam),
    ``DeepSpeedCPUAdagrad(optimizer.param_groups, lr=, weight_decay=)``; the groups keep their own
    settings (and torch's extra keys)."""
    user_m, ref_m = _model(), _model()
    user_opt = torch_cls(_groups(user_m), lr=1e-2, weight_decay=0.02)
    defaults = {k: user_opt.defaults[k] for k in ("lr", "weight_decay")}
    if torch_cls is torch.optim.Adagrad:
        ours = DeepSpeedCPUAdagrad(user_opt.param_groups, **defaults)
    else:
        ours = DeepSpeedCPUAdam(user_opt.param_groups, **defaults,
                                adamw_mode=torch_cls is torch.optim.AdamW)
    assert [g["weight_decay"] for g in ours.param_groups] == [0.05, 0.1, 0.0]
    assert [g["lr"] for g in ours.param_groups] == [1e-2, 2e-2, 5e-3]
    _train(user_m, ours)
    _train(ref_m, torch_cls(_groups(ref_m), lr=1e-2, weight_decay=0.02))
    assert _max_dev(user_m, ref_m) <= TOL


@pytest.mark.parametrize("case", ["DeepSpeedCPUAdam-adamw", "FusedAdam-l2", "DeepSpeedCPUAdagrad",
                                  "DeepSpeedCPULion", "FusedLion", "FusedLamb",
                                  "FusedAdam-adamw-torchfused"])
def test_state_dict_round_trip_resumes_bit_identically(case, monkeypatch):
    ours_of, _, forced = CASES[case]
    if forced is not None:
        _force_torch_path(monkeypatch, forced)
    full_m = _model()
    _train(full_m, ours_of(_groups(full_m)))

    half_m = _model()
    half_opt = ours_of(_groups(half_m))
    _train(half_m, half_opt, steps=range(20))
    buf = io.BytesIO()
    torch.save({"model": half_m.state_dict(), "optimizer": half_opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    resumed_m = _model()  # fresh objects, as in a new process
    resumed_m.load_state_dict(saved["model"])
    resumed_opt = ours_of(_groups(resumed_m))
    resumed_opt.load_state_dict(saved["optimizer"])
    assert resumed_opt.state_dict()["param_groups"] == half_opt.state_dict()["param_groups"]
    _train(resumed_m, resumed_opt, steps=range(20, STEPS))
    for a, b in zip(resumed_m.parameters(), full_m.parameters()):
        assert torch.equal(a, b)


def _positional(cls):
    """(name, default) of the parameters a caller may pass by position (self left out)."""
    return [(n, p.default) for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]


def test_signatures_are_deepspeeds():
    betas = (0.9, 0.999)
    assert _positional(DeepSpeedCPUAdam) == [
        ("model_params", inspect.Parameter.empty), ("lr", 1e-3), ("bias_correction", True),
        ("betas", betas), ("eps", 1e-8), ("weight_decay", 0), ("amsgrad", False),
        ("adamw_mode", True), ("fp32_optimizer_states", True)]
    assert _positional(FusedAdam) == [
        ("params", inspect.Parameter.empty), ("lr", 1e-3), ("bias_correction", True),
        ("betas", betas), ("eps", 1e-8), ("adam_w_mode", True), ("weight_decay", 0.0),
        ("amsgrad", False), ("set_grad_none", True)]
    assert _positional(DeepSpeedCPUAdagrad) == [
        ("model_params", inspect.Parameter.empty), ("lr", 1e-2), ("eps", 1e-10),
        ("weight_decay", 0), ("amsgrad", False), ("fp32_optimizer_states", True)]
    assert _positional(DeepSpeedCPULion) == [
        ("model_params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", betas),
        ("weight_decay", 0), ("fp32_optimizer_states", True)]
    assert _positional(FusedLion) == [
        ("params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", betas),
        ("weight_decay", 0.0), ("set_grad_none", True)]
    assert _positional(FusedLamb) == [
        ("params", inspect.Parameter.empty), ("lr", 1e-3), ("bias_correction", True),
        ("betas", betas), ("eps", 1e-8), ("eps_inside_sqrt", False), ("weight_decay", 0.0),
        ("max_grad_norm", 0.0), ("max_coeff", 10.0), ("min_coeff", 0.01), ("amsgrad", False)]


def test_positional_arguments_land_where_deepspeed_puts_them():
    p = [torch.nn.Parameter(torch.ones(2))]
    g = DeepSpeedCPUAdagrad(p, 0.1, 1e-6, 0.01).param_groups[0]
    assert (g["lr"], g["eps"], g["weight_decay"], g["lr_decay"]) == (0.1, 1e-6, 0.01, 0.0)
    g = FusedLamb(p, 0.1, False, (0.8, 0.9), 1e-6, True, 0.01).param_groups[0]
    assert (g["lr"], g["bias_correction"], g["betas"], g["eps"], g["eps_inside_sqrt"],
            g["weight_decay"]) == (0.1, False, (0.8, 0.9), 1e-6, True, 0.01)
    opt = FusedAdam(p, 0.1, True, (0.8, 0.9), 1e-6, False, 0.01)
    assert not opt.adamw_mode and opt.param_groups[0]["weight_decay"] == 0.01


@pytest.mark.parametrize("cls", [FusedAdam, FusedLion])
def test_set_grad_none(cls):
    p = torch.nn.Parameter(torch.ones(3))
    for flag in (True, False):
        opt = cls([p], set_grad_none=flag)
        for set_to_none in (None, not flag):  # an explicit argument wins
            p.grad = torch.ones(3)
            opt.zero_grad() if set_to_none is None else opt.zero_grad(set_to_none=set_to_none)
            if flag if set_to_none is None else set_to_none:
                assert p.grad is None
            else:
                assert torch.equal(p.grad, torch.zeros(3))


def test_unsupported_settings_say_so():
    p = torch.nn.Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    for cls in (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion):
        with pytest.raises(RuntimeError, match=f"{cls.__name__} needs CPU parameters, got meta"):
            cls([p]).step()
    with pytest.raises(RuntimeError, match="amsgrad"):
        FusedAdam([torch.nn.Parameter(torch.ones(2))], amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        DeepSpeedCPUAdam([torch.nn.Parameter(torch.ones(2))], amsgrad=True)


def test_fused_adam_without_bias_correction(monkeypatch):
    """CPU parameters: the compiled op does it (update m/(sqrt(v)+eps), no correction). Off the
    CPU (torch's fused kernel): a clear error."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = FusedAdam([p], lr=0.1, bias_correction=False, adam_w_mode=False)
    p.grad = torch.tensor([0.5, 0.25])
    opt.step()
    m, v = 0.1 * p.grad, 0.001 * p.grad ** 2
    want = torch.tensor([1.0, -2.0]) - 0.1 * m / (v.sqrt() + 1e-8)
    torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=0)
    _force_torch_path(monkeypatch, FusedAdam)
    opt = FusedAdam([p], bias_correction=False)
    with pytest.raises(ValueError, match="bias_correction=False is not supported"):
        opt.step()


@pytest.mark.parametrize("case", ["DeepSpeedCPUAdam-l2", "FusedAdam-adamw", "DeepSpeedCPUAdagrad",
                                  "DeepSpeedCPULion", "FusedLion"])
def test_without_the_compiled_op_the_torch_fallback_gives_the_same_numbers(case, monkeypatch):
    from dslaunch.kernels import cpu_optim

    monkeypatch.setattr(cpu_optim, "load_op", lambda name: None)
    monkeypatch.setattr("dslaunch.kernels.load_op", lambda name: None)
    ours_of, ref_of, _ = CASES[case]
    ours_m, ref_m = _model(), _model()
    ours = ours_of(_groups(ours_m))
    assert ours.compiled is False
    _train(ours_m, ours)
    _train(ref_m, ref_of(_groups(ref_m)))
    assert _max_dev(ours_m, ref_m) <= TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("case", ["FusedAdam-adamw", "FusedAdam-l2", "FusedLion", "FusedLamb"])
def test_fused_classes_on_cuda(case):
    ours_of, ref_of, _ = CASES[case]
    ours_m, ref_m = _model().cuda(), _model().cuda()
    ours = ours_of(_groups(ours_m))
    assert getattr(ours, "compiled", False) is False  # no CPU parameter: no CPU op loaded
    _train(ours_m, ours)
    _train(ref_m, ref_of(_groups(ref_m)))
    assert _max_dev(ours_m, ref_m) <= 1e-5  # torch's fused CUDA kernel vs its foreach path
    assert all(s["exp_avg"].shape == p.shape and s["exp_avg"].is_cuda
               for p, s in ours.state.items())
