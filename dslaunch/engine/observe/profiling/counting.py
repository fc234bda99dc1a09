"""Counting the floating-point work of a forward pass at the ATen level.

A ``TorchDispatchMode`` sees every operator a forward runs, however the model calls it:
``nn.Linear``, ``F.linear``, ``x @ w``, ``torch.einsum`` and ``F.scaled_dot_product_attention``
all reach ``mm`` / ``addmm`` / ``bmm`` / a fused attention kernel here, so nothing is missed for
being a functional instead of a module (DeepSpeed patches a list of functionals instead).

Rules (MACs: multiply-accumulates of the matrix products; FLOPs: 2 per MAC plus one per element
for the element-wise work around them):

- ``mm``/``addmm``/``bmm``/``baddbmm``: ``M x K x N`` MACs per matrix; ``addmm`` adds its bias
  (one FLOP per output element).
- ``convolution``: ``output elements x in_channels/groups x kernel`` MACs (transposed: input
  elements x out_channels/groups x kernel); the bias one FLOP per output element.
- fused attention (``_scaled_dot_product_*``): ``QK^T`` and ``AV``, ``B*H*Lq*Lk*(E+Ev)`` MACs,
  counted whole (a causal kernel skips about half; DeepSpeed counts it whole too).
- ``nn.MultiheadAttention``'s inference fast path (one fused kernel): its projections and
  attention by the same rules (its biases are not counted).
- element-wise and normalisation operators: one FLOP per output element (layer/group/batch norm:
  five), no MACs. Views, copies, indexing and embeddings: nothing.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _prod(shape) -> int:
    return math.prod(int(d) for d in shape)


def _mm(args, out):
    a, b = args[0], args[1]
    macs = _prod(a.shape) * int(b.shape[-1])
    return 2 * macs, macs


def _addmm(args, out):
    _, a, b = args[0], args[1], args[2]
    macs = _prod(a.shape) * int(b.shape[-1])
    return 2 * macs + out.numel(), macs


def _bmm(args, out):
    a, b = args[0], args[1]
    macs = _prod(a.shape) * int(b.shape[-1])
    return 2 * macs, macs


def _baddbmm(args, out):
    a, b = args[1], args[2]
    macs = _prod(a.shape) * int(b.shape[-1])
    return 2 * macs + out.numel(), macs


def _convolution(args, out):
    x, w, bias = args[0], args[1], args[2]
    transposed = bool(args[6]) if len(args) > 6 else False
    kernel = _prod(w.shape[2:])
    if transposed:  # weight [in, out/groups, *k]: every input element feeds out/groups x k outputs
        macs = x.numel() * int(w.shape[1]) * kernel
    else:  # weight [out, in/groups, *k]
        macs = out.numel() * int(w.shape[1]) * kernel
    return 2 * macs + (out.numel() if bias is not None else 0), macs


def _attention(args, out):
    q, k, v = args[0], args[1], args[2]
    lk = int(k.shape[-2])
    macs = _prod(q.shape) * lk + _prod(q.shape[:-1]) * lk * int(v.shape[-1])
    return 2 * macs, macs


def _native_mha(args, out):
    """nn.MultiheadAttention's inference fast path (one kernel): the q/k/v and output
    projections and the attention, batch-first [B, L, E]."""
    q, k = args[0], args[1]
    e = int(q.shape[-1])
    lq, lk = _prod(q.shape[:-1]), _prod(k.shape[:-1])
    batch = int(q.shape[0]) if q.dim() == 3 else 1
    macs = lq * e * e + 2 * lk * e * e  # projections of q, k, v
    macs += 2 * (lq // batch) * (lk // batch) * e * batch  # QK^T and AV over all heads
    macs += lq * e * e  # output projection
    return 2 * macs, macs


def _pointwise(args, out):
    return _first_tensor(out).numel(), 0


def _norm(args, out):
    return 5 * _first_tensor(out).numel(), 0


def _first_tensor(out):
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _packets(*names):
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


RULES: dict = {}
for _op in _packets("mm"):
    RULES[_op] = _mm
for _op in _packets("addmm"):
    RULES[_op] = _addmm
for _op in _packets("bmm"):
    RULES[_op] = _bmm
for _op in _packets("baddbmm"):
    RULES[_op] = _baddbmm
for _op in _packets("convolution", "_convolution"):
    RULES[_op] = _convolution
for _op in _packets("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                    "_flash_attention_forward", "_efficient_attention_forward"):
    RULES[_op] = _attention
for _op in _packets("_native_multi_head_attention"):
    RULES[_op] = _native_mha
for _op in _packets("add", "sub", "mul", "div", "relu", "relu_", "gelu", "silu", "silu_", "tanh",
                    "sigmoid", "elu", "leaky_relu", "hardtanh", "exp", "pow", "rsqrt", "sqrt",
                    "neg", "_softmax", "_log_softmax", "softmax", "mean", "sum", "add_", "mul_",
                    "div_", "where", "clamp", "max_pool2d_with_indices", "avg_pool2d",
                    "_adaptive_avg_pool2d", "upsample_nearest2d", "upsample_bilinear2d"):
    RULES[_op] = _pointwise
for _op in _packets("native_layer_norm", "native_group_norm", "native_batch_norm",
                    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                    "_fused_rms_norm"):
    RULES[_op] = _norm


def op_cost(func, args, out) -> tuple[int, int]:
    """(FLOPs, MACs) of one ATen call; (0, 0) for an operator without a rule (or one whose
    arguments the rule does not understand: counting must never break the forward)."""
    rule = RULES.get(func.overloadpacket)
    if rule is None:
        return 0, 0
    try:
        flops, macs = rule(args, out)
    except (AttributeError, IndexError, TypeError, ValueError):
        return 0, 0
    return int(flops), int(macs)


class CountingMode(TorchDispatchMode):
    """Calls ``sink(flops, macs)`` for every counted operator run while it is entered."""

    def __init__(self, sink):
        super().__init__()
        self._sink = sink

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flops, macs = op_cost(func, args, out)
        if flops or macs:
            self._sink(flops, macs)
        return out


class ForwardCounter:
    """Total FLOPs/MACs of ``model``'s next forward call, no per-module detail: what the engine
    measures once for MFU. ``attach`` hooks the root module; the hooks remove themselves when
    that forward returns (``done``), or ``detach`` removes them earlier."""

    def __init__(self):
        self.flops = 0
        self.macs = 0
        self.done = False
        self._mode = None
        self._handles = []

    def _add(self, flops, macs):
        self.flops += flops
        self.macs += macs

    def attach(self, model: torch.nn.Module) -> "ForwardCounter":
        def enter(module, inputs):
            if self._mode is None and not self.done:
                self._mode = CountingMode(self._add)
                self._mode.__enter__()

        def leave(module, inputs, output):
            if self._mode is not None:
                self.done = True
                self.detach()

        self._handles = [model.register_forward_pre_hook(enter),
                         model.register_forward_hook(leave, always_call=True)]
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
