"""dslaunch.checkpointing (DeepSpeed's ``deepspeed.checkpointing``): activation checkpointing.

In-process: blocks with dropout run plainly and under ``checkpoint`` give bit-identical outputs,
input and parameter gradients and the same random state afterwards (fp32 and fp64); the bytes
autograd saves during the forward (``torch.autograd.graph.saved_tensors_hooks``) are exactly the
block inputs; keyword, non-tensor and integer-tensor arguments and tuple outputs; ``configure``'s
rules and its config path; ``dslaunch.initialize`` applying a config's ``activation_checkpointing``
section; the module under ``--as-deepspeed``'s names. On 2 gloo ranks through `dslaunch run`
(tests/scripts/act_checkpoint_tp.py): dslaunch's tensor-parallel layers with per-TP-rank dropout,
every combination of partition_activations and checkpoint_in_cpu, bit-identical, with the saved
bytes halved by partitioning (padded slices for an odd size), and model_parallel_cuda_manual_seed.
"""

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dslaunch
from dslaunch import as_deepspeed
from dslaunch.engine.features import activation_checkpoint as impl
from helpers import launch, results

ck = dslaunch.checkpointing


@pytest.fixture(autouse=True)
def fresh_module():
    impl._unconfigure()
    yield
    impl._unconfigure()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return x + self.drop(self.proj(self.drop(F.gelu(self.fc(self.ln(x))))))


def _run(blocks, x_in, use):
    """Output, [input grad, parameter grads], bytes saved during the forward, the next draw."""
    torch.manual_seed(1)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
        x = x_in
        for b in blocks:
            x = ck.checkpoint(b, x) if use else b(x)
    for p in [x_in, *blocks.parameters()]:
        p.grad = None
    (x * torch.linspace(-1, 1, x.numel(), dtype=x.dtype).view_as(x)).sum().backward()
    return x.detach(), [x_in.grad] + [p.grad for p in blocks.parameters()], sum(saved), torch.rand(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bit_identical_with_dropout_and_saves_only_block_inputs(dtype):
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(16) for _ in range(3)).to(dtype).train()
    x_in = torch.randn(2, 8, 16, dtype=dtype, requires_grad=True)
    plain, checkpointed = _run(blocks, x_in, False), _run(blocks, x_in, True)
    assert torch.equal(plain[0], checkpointed[0])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], checkpointed[1]))
    assert torch.equal(plain[3], checkpointed[3])  # the random stream goes on as without it
    assert checkpointed[2] == 3 * x_in.numel() * x_in.element_size()  # one input per block
    assert plain[2] > 10 * checkpointed[2]


def test_keywords_non_tensors_and_tuple_outputs():
    lin = nn.Linear(4, 4).double()

    def fn(x, scale, idx, *, bias):
        return lin(x) * scale + bias, idx + 1, "tag"

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    idx = torch.arange(3)
    y, i, tag = ck.checkpoint(fn, x, 2.0, idx, bias=bias)
    assert tag == "tag" and torch.equal(i, idx + 1) and not i.requires_grad
    y.sum().backward()
    ref_x, ref_b = x.detach().requires_grad_(), bias.detach().requires_grad_()
    grads = [x.grad, bias.grad, lin.weight.grad.clone()]
    lin.weight.grad = None
    (lin(ref_x) * 2.0 + ref_b).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads, [ref_x.grad, ref_b.grad, lin.weight.grad]))
    with pytest.raises(RuntimeError, match="not with torch.autograd.grad"):
        torch.autograd.grad(ck.checkpoint(lin, x).sum(), [x])


def test_configure_rules_and_config_path():
    assert not ck.is_configured()
    ck.configure(None, deepspeed_config={"train_batch_size": 1, "activation_checkpointing": {
        "cpu_checkpointing": True, "profile": True, "number_checkpoints": 4}}, profile=False)
    assert ck.is_configured()
    assert (ck.CPU_CHECKPOINT, ck.PROFILE_TIME, ck.num_layers, ck.mp_size) == (True, False, 4, 1)
    ck.reset()  # nothing to free; stays configured
    assert ck.is_configured()
    with pytest.raises(ValueError, match="needs partition_activations"):
        ck.configure(None, contiguous_checkpointing=True)
    with pytest.raises(ValueError, match="needs num_checkpoints"):
        ck.configure(None, partition_activations=True, contiguous_checkpointing=True)
    ck.configure(None, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=2,
                 synchronize=True)
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    ck.checkpoint(lin, x).sum().backward()  # one rank: nothing to split; synchronize on the CPU
    assert x.grad is not None


def test_initialize_applies_the_config_section():
    model = nn.Sequential(nn.Linear(4, 4))
    dslaunch.initialize(model=model, config={"train_batch_size": 1})
    assert not ck.is_configured()  # no key written: the module is left as it was
    dslaunch.initialize(model=model, config={"train_batch_size": 1, "activation_checkpointing": {
        "partition_activations": True, "synchronize_checkpoint_boundary": True}})
    assert ck.is_configured() and ck.PARTITION_ACTIVATIONS and ck.SYNCHRONIZE
    assert not ck.CPU_CHECKPOINT


def test_deepspeed_names_reach_the_same_module():
    if "deepspeed" in sys.modules:
        pytest.skip("a deepspeed module is already imported in this process")
    as_deepspeed.install(environ={"RANK": "0", as_deepspeed._NOTICED: "1"})
    try:
        import deepspeed
        from deepspeed.runtime.activation_checkpointing import checkpointing

        assert deepspeed.checkpointing is checkpointing is dslaunch.checkpointing
        assert checkpointing.checkpoint is impl.checkpoint
        assert checkpointing.PARTITION_ACTIVATIONS is False  # module state reads through
    finally:
        as_deepspeed.uninstall()


def test_tensor_parallel_partition_and_cpu_on_two_ranks(tmp_path):
    launch(tmp_path, None, "act_checkpoint_tp.py", ["--out", tmp_path])
    for r in results(tmp_path):
        assert r["mp_size"] == 2 and r["default_same"] and r["tracked_differs"]
        for name, elements in (("even", 108), ("odd", 27)):
            for cpu in (0, 1):
                whole, split = r[f"{name}_partition0_cpu{cpu}"], r[f"{name}_partition1_cpu{cpu}"]
                for case in (whole, split):
                    assert case["out_equal"] and case["grads_equal"] and case["rng_after_equal"]
                assert whole["saved_bytes"] == 3 * elements * 8  # 3 blocks, fp64 inputs
                assert split["saved_bytes"] == 3 * -(-elements // 2) * 8  # this rank's slice
