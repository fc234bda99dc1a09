"""Tensor-level entry points of the CPU optimizer ops, with a torch fallback.

Each function updates flat CPU tensors in place in ONE pass over memory when the compiled op is
available, and with plain torch ops (same formula, several passes) when it is not:

    adam_step(param, grad, exp_avg, exp_avg_sq, step=, lr=, ..., copy_out=None, grad_scale=1.0)
    adagrad_step(param, grad, state_sum, step=, lr=, ..., copy_out=None, grad_scale=1.0)
    lion_step(param, grad, exp_avg, lr=, ..., copy_out=None, grad_scale=1.0)

param: float32 or bfloat16; grad: float32 or bfloat16 (multiplied by grad_scale first); states:
float32; copy_out (optional): float32 or bfloat16, receives the updated param (the ZeRO-Offload
form: fp32 master shard + bf16 grad shard in, bf16 model copy out, all in the same pass).
All tensors must be contiguous CPU tensors with the same number of elements.
Each returns True when the compiled op did the work, False when torch did. ``use_compiled=False``
forces the torch path; ``op=`` passes a specific build of the op (tests use it to run one SIMD level);
``threads=`` the compiled op's thread count (torch's setting by default).
"""

from __future__ import annotations

import torch

from dslaunch.kernels import load_op

_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _check(param, grad, states, copy_out):
    tensors = [("param", param), ("grad", grad)] + states
    if copy_out is not None:
        tensors.append(("copy_out", copy_out))
    n = param.numel()
    for what, t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"{what} must be a CPU tensor, got {t.device}")
        if t.numel() != n:
            raise ValueError(f"{what} has {t.numel()} elements, param has {n}")
        if not t.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
    for what, t in states:
        if t.dtype != torch.float32:
            raise ValueError(f"{what} must be float32 (fp32 optimizer states), got {t.dtype}")


def _compiled(op_name, param, grad, copy_out, op=None):
    """The op module (`op` if given, else load_op's) if it supports these dtypes, else None."""
    if param.dtype not in _CODES or grad.dtype not in _CODES:
        return None
    if copy_out is not None and copy_out.dtype not in _CODES:
        return None
    return op if op is not None else load_op(op_name)


def _copy_args(copy_out):
    return (0, -1) if copy_out is None else (copy_out.data_ptr(), _CODES[copy_out.dtype])


def adam_step(param, grad, exp_avg, exp_avg_sq, *, step: int, lr: float, beta1: float = 0.9,
              beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
              adamw: bool = False, bias_correction: bool = True, grad_scale: float = 1.0,
              copy_out=None, use_compiled: bool = True, op=None, threads: int | None = None) -> bool:
    _check(param, grad, [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)], copy_out)
    op = _compiled("cpu_adam", param, grad, copy_out, op) if use_compiled else None
    if op is not None:
        op.adam(param.data_ptr(), _CODES[param.dtype], grad.data_ptr(), _CODES[grad.dtype],
                exp_avg.data_ptr(), exp_avg_sq.data_ptr(), *_copy_args(copy_out), param.numel(),
                lr, beta1, beta2, eps, weight_decay, step, adamw, bias_correction, grad_scale,
                threads or torch.get_num_threads())
        return True
    p = param.float() if param.dtype != torch.float32 else param
    g = grad.float() if grad.dtype != torch.float32 else grad
    if grad_scale != 1.0:
        g = g * grad_scale
    if weight_decay != 0:
        if adamw:
            p.mul_(1 - lr * weight_decay)
        else:
            g = g.add(p, alpha=weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    denom = (exp_avg_sq.sqrt() / bc2 ** 0.5).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-lr / bc1)
    _write_back(param, p, copy_out)
    return False


def adagrad_step(param, grad, state_sum, *, step: int, lr: float, lr_decay: float = 0.0,
                 eps: float = 1e-10, weight_decay: float = 0.0, grad_scale: float = 1.0,
                 copy_out=None, use_compiled: bool = True, op=None, threads: int | None = None) -> bool:
    _check(param, grad, [("state_sum", state_sum)], copy_out)
    op = _compiled("cpu_adagrad", param, grad, copy_out, op) if use_compiled else None
    if op is not None:
        op.adagrad(param.data_ptr(), _CODES[param.dtype], grad.data_ptr(), _CODES[grad.dtype],
                   state_sum.data_ptr(), *_copy_args(copy_out), param.numel(), lr, lr_decay, eps,
                   weight_decay, step, grad_scale, threads or torch.get_num_threads())
        return True
    p = param.float() if param.dtype != torch.float32 else param
    g = grad.float() if grad.dtype != torch.float32 else grad
    if grad_scale != 1.0:
        g = g * grad_scale
    if weight_decay != 0:
        g = g.add(p, alpha=weight_decay)
    clr = lr / (1 + (step - 1) * lr_decay)
    state_sum.addcmul_(g, g, value=1)
    p.addcdiv_(g, state_sum.sqrt().add_(eps), value=-clr)
    _write_back(param, p, copy_out)
    return False


def lion_step(param, grad, exp_avg, *, lr: float, beta1: float = 0.9, beta2: float = 0.99,
              weight_decay: float = 0.0, grad_scale: float = 1.0, copy_out=None,
              use_compiled: bool = True, op=None, threads: int | None = None) -> bool:
    _check(param, grad, [("exp_avg", exp_avg)], copy_out)
    op = _compiled("cpu_lion", param, grad, copy_out, op) if use_compiled else None
    if op is not None:
        op.lion(param.data_ptr(), _CODES[param.dtype], grad.data_ptr(), _CODES[grad.dtype],
                exp_avg.data_ptr(), *_copy_args(copy_out), param.numel(), lr, beta1, beta2,
                weight_decay, grad_scale, threads or torch.get_num_threads())
        return True
    p = param.float() if param.dtype != torch.float32 else param
    g = grad.float() if grad.dtype != torch.float32 else grad
    if grad_scale != 1.0:
        g = g * grad_scale
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    update = exp_avg.mul(beta1).add_(g, alpha=1 - beta1).sign_()
    p.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(g, alpha=1 - beta2)
    _write_back(param, p, copy_out)
    return False


def _write_back(param, p, copy_out):
    if p is not param:
        param.copy_(p)
    if copy_out is not None:
        copy_out.copy_(param)
