"""The eigenvalue section (``engine/features/eigenvalue.py``, ``engine/features/eigenvalue_hook.py``): DeepSpeed's
``Eigenvalue`` against Hessians known exactly (a quadratic; a small MLP's explicit Hessian from
``torch.autograd.functional.hessian``), its result shape and normalisation, the config section,
and the engine computing it at every ``gas_boundary_resolution``-th boundary (this process).

DeepSpeed 0.18.9's own ``Eigenvalue`` (its venv, torch 2.13.0+cpu, measured 2026-11-27, one-off
script), p.grad from ``backward(create_graph=True)``, on a quadratic (blocks 5 / -3), a 3-block
tanh MLP and a 2-block example GPT (math attention), with max_iter/tol/stability 100/1e-2/0,
100/1e-2/1e-6 and 2000/1e-8/0, loss scale 1 and 1024: the same raw eigenvalues bit for bit (e.g.
MLP 0.0966955 0.12964 0.551669; GPT -13.326 -5.46137 at the defaults, -13.3923 -5.66803 converged)
and the same normalised result dict.
"""

import copy
import sys
import warnings

import pytest
import torch

import dslaunch
from dslaunch.config import ConfigError, resolve_config
from dslaunch.engine.features.eigenvalue import Eigenvalue
from helpers import EXAMPLES


def _rotated(eigenvalues, seed):
    """A symmetric matrix with the given eigenvalues (a random rotation)."""
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues),
                                       generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))
    return (q * torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T


class _Quadratic(torch.nn.Module):
    """0.5 x^T A x: its Hessian is A."""

    def __init__(self, a):
        super().__init__()
        self.register_buffer("a", a.float())
        self.x = torch.nn.Parameter(torch.randn(a.shape[0]))

    def forward(self):
        return 0.5 * self.x @ self.a @ self.x


class _Quadratics(torch.nn.Module):
    def __init__(self, *matrices):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Quadratic(a) for a in matrices)

    def forward(self):
        return sum(block() for block in self.blocks)


def _graph_grads(loss, module):
    params = [p for p in module.parameters()]
    return dict(zip(params, torch.autograd.grad(loss, params, create_graph=True)))


def _eigen(**kw):
    return Eigenvalue(**{"max_iter": 1000, "tol": 1e-9, "layer_name": "blocks",
                         "layer_num": 2, **kw})


def test_quadratic_gives_the_dominant_eigenvalue_of_each_block():
    torch.manual_seed(0)
    model = _Quadratics(_rotated([5.0, 2.0, 1.0, -0.5], 1), _rotated([-3.0, 1.0, 0.5], 2))
    grads = _graph_grads(model(), model)
    raw = _eigen().block_eigenvalues(model, grads=grads)
    assert raw == pytest.approx([5.0, -3.0], rel=1e-4)  # signed: the largest in magnitude

    result = _eigen().compute_eigenvalue(model, grads=grads)
    # DeepSpeed's shape: every block parameter's id -> (|value| / max |value|, block index)
    assert result == {id(model.blocks[0].x): (pytest.approx(1.0), 0),
                      id(model.blocks[1].x): (pytest.approx(0.6, rel=1e-4), 1)}


def test_reads_p_grad_with_graph_as_deepspeed_and_leaves_the_random_state():
    torch.manual_seed(0)
    model = _Quadratics(_rotated([4.0, 1.0], 3), _rotated([2.0, -1.0], 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_graph=True's reference-cycle warning
        model().backward(create_graph=True)
    state = torch.random.get_rng_state()
    assert _eigen().block_eigenvalues(model) == pytest.approx([4.0, 2.0], rel=1e-4)
    assert torch.equal(torch.random.get_rng_state(), state)
    for p in model.parameters():
        p.grad = None


def test_the_loss_scale_is_divided_out():
    torch.manual_seed(0)
    model = _Quadratics(_rotated([3.0, 1.0, 0.2], 5), _rotated([1.5, 0.5], 6))
    scaled = _eigen().block_eigenvalues(model, scale=64.0, grads=_graph_grads(64.0 * model(), model))
    assert scaled == pytest.approx([3.0, 1.5], rel=1e-4)


def test_gradients_without_graph_give_an_empty_result():
    torch.manual_seed(0)
    model = _Quadratics(_rotated([1.0], 7), _rotated([2.0], 8))
    model().backward()  # no create_graph: p.grad has no grad_fn
    assert _eigen().compute_eigenvalue(model) == []


def test_the_defaults_stop_at_tol_and_max_iter():
    torch.manual_seed(0)
    model = _Quadratics(_rotated([1.0, 0.99, 0.98], 9), _rotated([2.0], 10))
    grads = _graph_grads(model(), model)
    calls = []
    original = torch.autograd.grad

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.autograd.grad = counting
    try:
        Eigenvalue(max_iter=3, tol=0.0, layer_name="blocks", layer_num=1).block_eigenvalues(
            model, grads=grads)
    finally:
        torch.autograd.grad = original
    assert len(calls) == 3


def test_bad_blocks_are_named():
    with pytest.raises(ValueError, match="layer_num must be > 0"):
        Eigenvalue(layer_name="blocks", layer_num=0)
    model = _Quadratics(_rotated([1.0], 1), _rotated([1.0], 2))
    with pytest.raises(ValueError, match="'layers'"):
        Eigenvalue(layer_name="layers", layer_num=1).compute_eigenvalue(model)


# -- a small MLP against its explicit Hessian -----------------------------------------------------

class _MLP(torch.nn.Module):
    def __init__(self, width=6, depth=2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return torch.nn.functional.mse_loss(self.head(x).squeeze(-1), y)


def _explicit_dominant(model, block, x, y):
    """The largest-magnitude eigenvalue of the loss Hessian over one block's parameters."""
    model = copy.deepcopy(model).double()  # the caller's parameters stay as they are
    names = [n for n, _ in model.named_parameters() if n.startswith(f"blocks.{block}.")]
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    flat0 = torch.cat([params[n].detach().reshape(-1) for n in names]).double()

    def loss_of(flat):
        swapped, at = {}, 0
        for name, shape in zip(names, shapes):
            n = shape.numel()
            swapped[name] = flat[at:at + n].reshape(shape)
            at += n
        others = {k: v.detach() for k, v in params.items() if k not in swapped}
        return torch.func.functional_call(model, {**others, **swapped}, (x, y))

    hessian = torch.autograd.functional.hessian(loss_of, flat0)
    values = torch.linalg.eigvalsh(hessian)
    return values[values.abs().argmax()].item()


def test_mlp_blocks_match_the_explicit_hessian():
    torch.manual_seed(0)
    model = _MLP()
    x, y = torch.randn(32, 6), torch.randn(32)
    want = [_explicit_dominant(model, b, x.double(), y.double()) for b in range(2)]
    grads = _graph_grads(model(x, y), model)
    got = _eigen(max_iter=3000, tol=1e-10).block_eigenvalues(model, grads=grads)
    assert got == pytest.approx(want, rel=2e-3)


# -- config ---------------------------------------------------------------------------------------

def test_the_section_is_typed_with_deepspeeds_defaults():
    cfg = resolve_config({"train_batch_size": 2}, world_size=1).typed.eigenvalue
    assert (cfg.enabled, cfg.verbose, cfg.max_iter, cfg.tol, cfg.stability,
            cfg.gas_boundary_resolution, cfg.layer_name, cfg.layer_num) == \
        (False, False, 100, 1e-2, 1e-6, 1, "bert.encoder.layer", 0)
    on = {"train_batch_size": 2, "eigenvalue": {"enabled": True, "layer_name": "blocks",
                                                "layer_num": 2}}
    assert resolve_config(on, world_size=1).typed.eigenvalue.layer_num == 2
    from dslaunch.runtime.config import DeepSpeedConfig  # DeepSpeed's attribute names

    ds = DeepSpeedConfig(on)
    assert (ds.eigenvalue_enabled, ds.eigenvalue_layer_name, ds.eigenvalue_max_iter) == \
        (True, "blocks", 100)


@pytest.mark.parametrize("section, extra, message", [
    ({"enabled": True}, {}, "eigenvalue.layer_num: name the model's list of blocks"),
    ({"enabled": True, "layer_num": 2}, {"zero_optimization": {"stage": 3}},
     "eigenvalue.enabled: needs zero_optimization.stage 0, 1 or 2"),
    ({"enabled": True, "layer_num": 2, "max_iters": 5}, {}, "did you mean max_iter"),
])
def test_impossible_sections_are_refused(section, extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config({"train_batch_size": 2, "eigenvalue": section, **extra}, world_size=1)


# -- the engine -----------------------------------------------------------------------------------

def _train(eigenvalue=None, stage=0, steps=4, seed=0, spy=None):
    torch.manual_seed(seed)
    model = _MLP()
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 1000}
    if eigenvalue is not None:
        cfg["eigenvalue"] = eigenvalue
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=data), torch.randn(8, generator=data))
               for _ in range(2 * steps)]
    if spy is not None:
        spy(engine, batches)
    for x, y in batches:
        engine.backward(engine(x, y))
        engine.step()
    return engine, model


EIGEN = {"enabled": True, "layer_name": "blocks", "layer_num": 2, "gas_boundary_resolution": 2,
         "max_iter": 3000, "tol": 1e-10}


@pytest.mark.parametrize("stage", [0, 2])
def test_engine_computes_at_every_resolution_th_boundary_on_the_windows_hessian(stage):
    seen = []

    def spy(engine, batches):
        compute = engine.eigenvalue.compute_eigenvalue

        def recording(module, device=None, scale=1.0, grads=None):
            # the window this boundary closes: its two micro-batches, the weights before the step
            step = engine.global_steps
            x = torch.cat([batches[2 * step][0], batches[2 * step + 1][0]])
            y = torch.cat([batches[2 * step][1], batches[2 * step + 1][1]])
            want = [_explicit_dominant(module, b, x.double(), y.double()) for b in range(2)]
            seen.append((step, want, engine.eigenvalue.block_eigenvalues(module, device, scale,
                                                                         grads)))
            return compute(module, device, scale, grads)

        engine.eigenvalue.compute_eigenvalue = recording

    engine, model = _train(EIGEN, stage=stage, spy=spy)
    assert engine.eigenvalue_enabled() and engine.eigenvalue.gas_boundary_resolution == 2
    assert [step for step, _, _ in seen] == [1, 3]  # boundaries 2 and 4 (global_steps before)
    for _, want, got in seen:  # each micro-batch's mean loss over 2: the window's mean
        assert got == pytest.approx(want, rel=2e-3)
    last = seen[-1][2]
    top = max(abs(v) for v in last)
    ids = {id(p): b for b in range(2) for p in model.blocks[b].parameters()}
    assert engine.block_eigenvalue == {
        pid: (pytest.approx(abs(last[b]) / top), b) for pid, b in ids.items()}
    events = engine._eigenvalues.summary_events(engine.block_eigenvalue, 7)
    assert [name for name, _, _ in events] == [f"Train/Eigenvalues/ModelBlockParam_{i}"
                                               for i in range(4)]


def test_engine_training_is_unchanged_and_off_computes_nothing():
    off, model_off = _train()
    on, model_on = _train(EIGEN)
    assert off.eigenvalue is None and off.block_eigenvalue is None
    assert not off.eigenvalue_enabled()
    assert isinstance(on.block_eigenvalue, dict)
    for a, b in zip(model_off.parameters(), model_on.parameters()):
        assert torch.equal(a, b)


def test_engine_runs_attention_through_a_kernel_with_second_derivatives():
    sys.path.insert(0, str(EXAMPLES))
    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=2, d_model=32, n_head=2))
    engine, *_ = dslaunch.initialize(model=model, config={
        "train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "eigenvalue": {"enabled": True, "layer_name": "blocks", "layer_num": 2}})
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(tok, tok))  # the fused CPU attention has no double backward
    engine.step()
    assert sorted({block for _, block in engine.block_eigenvalue.values()}) == [0, 1]
