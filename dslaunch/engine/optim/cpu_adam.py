"""CPU optimizers backed by dslaunch's compiled ops, torch fallback. DeepSpeed's signatures
(``dslaunch.ops`` hands them out as DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion):

    DSCPUAdam(model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True)
    DSCPUAdagrad(model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True, *, lr_decay=0, initial_accumulator_value=0)
    DSCPULion(model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True)

(``lr_decay`` and ``initial_accumulator_value`` are torch.optim.Adagrad's, beyond DeepSpeed's.)

Parameters live on the CPU, fp32 or bf16. With ``fp32_optimizer_states`` (the default) states are
fp32 whatever the parameter dtype and the compiled op updates a bf16 parameter directly (rounding
to nearest even once per step). When the op is unavailable (no compiler, odd CPU) the same
formula runs with torch ops and ``self.compiled`` is False. fp32 results equal
torch.optim.Adam / AdamW / Adagrad (and the reference Lion) to float rounding.

Subclasses may step parameters that are not on the CPU another way (``_step_elsewhere``;
``engine/optim/fused.py``: FusedAdam, FusedLion); here such a parameter is an error.

For ZeRO-Offload's fused form (fp32 master + bf16 grad in, bf16 copy out, one pass) call
:func:`dslaunch.kernels.cpu_optim.adam_step` with ``copy_out=``.
"""

from __future__ import annotations

import torch

from dslaunch.kernels import cpu_optim


class CPUOptimizer(torch.optim.Optimizer):
    _op_name = ""

    def __init__(self, params, defaults, fp32_optimizer_states: bool):
        super().__init__(params, defaults)
        self.fp32_optimizer_states = fp32_optimizer_states
        from dslaunch.kernels import load_op

        self.compiled = self._needs_op() and load_op(self._op_name) is not None

    def _needs_op(self) -> bool:
        """Whether to load the compiled op now (subclasses whose parameters may all live
        elsewhere load it only when one is on the CPU)."""
        return True

    def _for_op(self, p) -> bool:
        """Whether the compiled CPU op (or its torch fallback) steps ``p``; else _step_elsewhere."""
        return p.device.type == "cpu"

    def _step_elsewhere(self, group, params: list) -> None:
        """Step the parameters of ``group`` that are not for the CPU op."""
        raise RuntimeError(f"{type(self).__name__} needs CPU parameters, got {params[0].device}")

    def _state_dtype(self, p):
        return torch.float32 if self.fp32_optimizer_states else p.dtype

    def _state_tensor(self, p):
        return torch.zeros(p.numel(), dtype=self._state_dtype(p), device=p.device)

    def _params_with_grad(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            yield p

    @staticmethod
    def _flat(t):
        return t.detach().view(-1) if t.is_contiguous() else t.detach().contiguous().view(-1)

    # Subclasses name their per-parameter state tensors and do one update on flat fp32 views.
    _state_names: tuple = ()

    def _initial_state(self, p, group, name: str):
        return self._state_tensor(p)

    def _update(self, group, step: int, param, grad, *states, use_compiled: bool,
                grad_scale: float = 1.0, copy_out=None, threads=None) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale: float = 1.0, copy_outs=None, on_updated=None,
             threads: int | None = None):
        """torch's step, plus what ZeRO-Offload's pipeline (``zero/offload_pipeline.py``) asks:
        every gradient is multiplied by ``grad_scale`` inside the update, ``copy_outs`` maps a
        parameter to a tensor that receives its updated value (a 16-bit copy) in the same pass,
        ``on_updated(p)`` is called as soon as ``p`` is updated, ``threads`` sets the compiled
        op's thread count."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        fused = dict(grad_scale=grad_scale, copy_outs=copy_outs or {}, threads=threads)
        for group in self.param_groups:
            params = list(self._params_with_grad(group))
            here = [p for p in params if self._for_op(p)]
            if len(here) < len(params):
                if grad_scale != 1.0 or copy_outs:
                    raise RuntimeError(f"{type(self).__name__}: grad_scale and copy_outs are "
                                       "for CPU parameters")
                self._step_elsewhere(group, [p for p in params if not self._for_op(p)])
            for p in here:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    for name in self._state_names:
                        state[name] = self._initial_state(p, group, name)
                state["step"] += 1
                self._run(p, group, state["step"], [state[n] for n in self._state_names], **fused)
                if on_updated is not None:
                    on_updated(p)
        return loss

    def _run(self, p, group, step: int, states: list, grad_scale: float = 1.0, copy_outs=None,
             threads: int | None = None) -> None:
        """Call _update on the flat param, grad and fp32 states; write back what needed copying."""
        param, grad = self._flat(p), self._flat(p.grad)
        fp32 = [s if s.dtype == torch.float32 else s.float() for s in states]
        # low-precision states (fp32_optimizer_states=False) take the torch path in fp32
        use_compiled = all(s is f for s, f in zip(states, fp32))
        work = param if (use_compiled or param.dtype == torch.float32) else param.float()
        copy_out = (copy_outs or {}).get(p)
        self._update(group, step, work, grad, *fp32, use_compiled=use_compiled,
                     grad_scale=grad_scale, copy_out=None if copy_out is None else
                     self._flat(copy_out), threads=threads)
        if work is not param:
            param.copy_(work)
        if param.data_ptr() != p.data_ptr():
            p.detach().copy_(param.view_as(p))
        for s, f in zip(states, fp32):
            if s is not f:
                s.copy_(f)

    def load_state_dict(self, state_dict):
        """torch's loader casts every floating state to the parameter's dtype, which would turn
        the fp32 states of a bf16 parameter into bf16; put the saved precision back."""
        import itertools

        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        id_map = dict(zip(saved_ids, params))
        keep = {pid: {k: v for k, v in st.items()
                      if torch.is_tensor(v) and v.is_floating_point() and k != "step"}
                for pid, st in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        for pid, tensors in keep.items():
            p = id_map.get(pid)
            for key, value in tensors.items():
                self.state[p][key] = value.detach().to(device=p.device,
                                                       dtype=self._state_dtype(p)).clone()

    def state_steps(self) -> list[int]:
        return [s["step"] for s in self.state.values() if "step" in s]


class DSCPUAdam(CPUOptimizer):
    _op_name = "cpu_adam"
    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("DSCPUAdam does not support amsgrad (nor does DeepSpeedCPUAdam)")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction)
        self.adamw_mode = adamw_mode
        super().__init__(model_params, defaults, fp32_optimizer_states)

    def _update(self, group, step, param, grad, m, v, use_compiled, **fused):
        beta1, beta2 = group["betas"]
        cpu_optim.adam_step(param, grad, m, v, step=step, lr=group["lr"], beta1=beta1, beta2=beta2,
                            eps=group["eps"], weight_decay=group["weight_decay"],
                            adamw=self.adamw_mode, bias_correction=group["bias_correction"],
                            use_compiled=use_compiled, **fused)


class DSCPUAdagrad(CPUOptimizer):
    _op_name = "cpu_adagrad"
    _state_names = ("sum",)

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0.0, amsgrad=False,
                 fp32_optimizer_states=True, *, lr_decay=0.0, initial_accumulator_value=0.0):
        if amsgrad:
            raise ValueError("DSCPUAdagrad does not support amsgrad")
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, lr_decay=lr_decay,
                        initial_accumulator_value=initial_accumulator_value)
        super().__init__(model_params, defaults, fp32_optimizer_states)

    def _initial_state(self, p, group, name):
        return self._state_tensor(p).fill_(group["initial_accumulator_value"])

    def _update(self, group, step, param, grad, s, use_compiled, **fused):
        cpu_optim.adagrad_step(param, grad, s, step=step, lr=group["lr"], lr_decay=group["lr_decay"],
                               eps=group["eps"], weight_decay=group["weight_decay"],
                               use_compiled=use_compiled, **fused)


class DSCPULion(CPUOptimizer):
    _op_name = "cpu_lion"
    _state_names = ("exp_avg",)

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0,
                 fp32_optimizer_states=True):
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay)
        super().__init__(model_params, defaults, fp32_optimizer_states)

    def _update(self, group, step, param, grad, m, use_compiled, **fused):
        beta1, beta2 = group["betas"]
        cpu_optim.lion_step(param, grad, m, lr=group["lr"], beta1=beta1, beta2=beta2,
                            weight_decay=group["weight_decay"], use_compiled=use_compiled, **fused)


__all__ = ["DSCPUAdam", "DSCPUAdagrad", "DSCPULion"]
