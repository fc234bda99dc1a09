"""Muon (momentum orthogonalized by Newton-Schulz) with an auxiliary AdamW: the config's
``optimizer: {type: Muon}``, as DeepSpeed 0.18+ defines it.

Which parameters: Muon steps the hidden matrices, AdamW the rest. ``tag_muon_params(model)``
sets ``p.use_muon`` by DeepSpeed's rule: a parameter of two or more dimensions (its layer shape,
``ds_shape`` under zero.Init) whose name contains neither ``embed`` nor ``lm_head`` (lower-cased)
is a Muon parameter; biases, norms, embeddings and the head are AdamW's. As in DeepSpeed the
rule overwrites a value set earlier; pass a client optimizer to choose otherwise.

The config's keys (``optimizer.params``), DeepSpeed's names:
  lr, weight_decay: both halves; ``muon_lr`` / ``adam_lr`` override lr for one half
  momentum (0.95), ns_method ("gram" | "standard"): Muon; betas ((0.9, 0.95)), eps (1e-10),
  adam_w_mode (true): AdamW. Defaults when absent: Muon lr 0.02, AdamW lr 3e-4, weight_decay 0.
  A param group the model_parameters carry keeps its own settings (per half, same keys).
dslaunch's own (DeepSpeed's muon_update arguments, not config keys there): ns_steps (5),
nesterov (true), ns_dtype ("auto": DeepSpeed's choice: "gram" in fp16 where the device computes
fp16, "standard" in bf16 where it computes bf16, else fp32; or "fp32" / "bf16" / "fp16" / "fp64").

One Muon step on a matrix G (its gradient) with momentum buffer M:
  M <- beta M + (1 - beta) G;  U <- (1 - beta) G + beta M if nesterov else M
  O <- NS_k(U) * sqrt(max(1, rows / cols));  W <- W (1 - lr wd) - lr O
NS_k: X = U / (||U||_F + 1e-7), transposed so rows <= cols, then k times
  A = X X^T;  X <- a X + (b A + c A^2) X   with (a, b, c) = (3.4445, -4.7750, 2.0315).
"gram" computes the same polynomial on the rows x rows Gram matrix R = X X^T, accumulating the
left factor Q (X <- Q X at the end and at a restart after two iterations): fewer flops when
cols >> rows, the same result in exact arithmetic. A 4-D (convolution) weight is orthogonalized
as (out, rest) with DeepSpeed's scale (its last two dims); a 3-D one as a batch of matrices.

Under ZeRO 1-3 the optimizer sees flat shards: ``muon_zero.py`` computes the update on whole
matrices before the step and this class then only applies decay and step to the 1-D shard.
"""

from __future__ import annotations

import torch

from dslaunch.engine.optim.newton_schulz import NS_DTYPES, NS_METHODS, momentum_update_, ns_dtype, orthogonalize
from dslaunch.kernels import cpu_optim

MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method", "ns_steps", "nesterov", "ns_dtype")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram",
                 "ns_steps": 5, "nesterov": True, "ns_dtype": "auto"}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    shape = tuple(getattr(p, "ds_shape", None) or p.shape)
    lowered = name.lower()
    return len(shape) >= 2 and "embed" not in lowered and "lm_head" not in lowered


def tag_muon_params(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        p.use_muon = is_muon_param(name, p)


# -- Newton-Schulz -------------------------------------------------------------------------------

def split_param_groups(model_parameters, optimizer_params: dict) -> list:
    """DeepSpeed's split: each incoming group becomes a Muon half and an AdamW half (by
    ``p.use_muon``); settings: config value, then muon_lr / adam_lr, then the group's own."""
    groups, loose = [], []
    for item in model_parameters:
        (groups if isinstance(item, dict) else loose).append(item)
    if loose or not groups:
        groups.append({"params": loose})
    untagged = [p for g in groups for p in g["params"] if not hasattr(p, "use_muon")]
    if untagged:
        raise ValueError(f"Muon: {len(untagged)} parameters have no use_muon attribute; "
                         "dslaunch.initialize tags the model's own (pass them as part of the "
                         "model, or set p.use_muon = True / False)")
    out = []
    for gi, group in enumerate(groups):
        trainable = [p for p in group["params"] if p.requires_grad]
        for use_muon, label, keys, defaults, lr_key in (
                (True, "muon", MUON_KEYS, MUON_DEFAULTS, "muon_lr"),
                (False, "adam", ADAM_KEYS, ADAM_DEFAULTS, "adam_lr")):
            half = [p for p in trainable if bool(p.use_muon) is use_muon]
            if not half:
                continue
            settings = dict(defaults)
            settings.update({k: optimizer_params[k] for k in keys if k in optimizer_params})
            if lr_key in optimizer_params:
                settings["lr"] = optimizer_params[lr_key]
            settings.update({k: v for k, v in group.items() if k in keys})
            settings["betas"] = tuple(settings["betas"]) if "betas" in settings else None
            if settings["betas"] is None:
                del settings["betas"]
            prefix = group.get("name") or (f"group{gi}" if len(groups) > 1 else None)
            name = f"{prefix}-{label}-params" if prefix else f"{label}-params"
            out.append(dict(params=half, use_muon=use_muon, name=name, **settings))
    return out


class Muon(torch.optim.Optimizer):
    """DeepSpeed's MuonWithAuxAdam: param groups carry ``use_muon``; Muon groups take
    lr, momentum, weight_decay, ns_method, ns_steps, nesterov, ns_dtype; the others
    lr, betas, eps, weight_decay (AdamW, or Adam with L2 decay when ``adam_w_mode=False``)."""

    def __init__(self, param_groups, adam_optimizer=None, adam_optimizer_kwargs=None,
                 adam_w_mode: bool = True, fallback_to_inline: bool = False):
        """DeepSpeed's signature; ``adam_optimizer`` / ``adam_optimizer_kwargs`` /
        ``fallback_to_inline`` are accepted and unused: the AdamW half is always this class's
        own (the compiled CPU Adam op on CPU parameters, torch ops elsewhere)."""
        groups = []
        for g in param_groups:
            if "use_muon" not in g:
                raise ValueError("Muon: every param group needs use_muon (True / False)")
            defaults = MUON_DEFAULTS if g["use_muon"] else ADAM_DEFAULTS
            g = {**defaults, **g}
            if g["use_muon"] and g["ns_method"] not in NS_METHODS:
                raise ValueError(f"optimizer.params.ns_method must be one of {NS_METHODS}, "
                                 f"got {g['ns_method']!r}")
            if g["use_muon"] and g["ns_dtype"] != "auto" and g["ns_dtype"] not in NS_DTYPES:
                raise ValueError(f"optimizer.params.ns_dtype: auto, fp32, bf16 or fp16, "
                                 f"got {g['ns_dtype']!r}")
            groups.append(g)
        super().__init__(groups, {})
        self.adam_w_mode = adam_w_mode
        self.prepared = set()  # ids of ZeRO shards whose .grad holds the whole-matrix update

    def muon_update(self, group, grad, buf):
        """The orthogonalized update of one whole matrix (momentum ``buf`` updated in place)."""
        u = momentum_update_(grad, buf, group["momentum"], group["nesterov"])
        dtype = ns_dtype(group["ns_method"], grad.device, group["ns_dtype"])
        return orthogonalize(u, steps=group["ns_steps"], method=group["ns_method"], dtype=dtype)

    def prepare_zero_step(self, strategy) -> None:
        """ZeRO 1-3 (stage12.py calls it before ``step``): whole-matrix updates into the shards'
        ``.grad`` (``muon_zero.py``)."""
        from dslaunch.engine.optim.muon_zero import orthogonalize_shards

        orthogonalize_shards(self, strategy)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group(group)
            else:
                self._adam_group(group)
        return loss

    def _muon_group(self, group):
        lr, wd = group["lr"], group["weight_decay"]
        for p in group["params"]:
            if p.dim() >= 2:  # a whole matrix: ZeRO 0, or a single process
                state = self.state[p]
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=grad.dtype)
                update = self.muon_update(group, grad, state["momentum_buffer"])
            else:  # a flat ZeRO shard: prepare_zero_step left the update in .grad
                if p.grad is None:
                    continue
                if id(p) not in self.prepared:
                    raise RuntimeError("Muon: a flat parameter without a whole-matrix update; "
                                       "under ZeRO the strategy calls prepare_zero_step first")
                self.prepared.discard(id(p))
                update = p.grad
            if wd:
                p.mul_(1 - lr * wd)
            p.add_(update.to(p.dtype), alpha=-lr)

    def _adam_group(self, group):
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            state = self.state[p]
            low = p.dtype in (torch.float32, torch.bfloat16, torch.float16)
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32 if low else p.dtype)
                state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])
            state["step"] = int(state["step"]) + 1  # a loaded checkpoint may hold a tensor
            kw = dict(step=state["step"], lr=group["lr"], beta1=beta1, beta2=beta2,
                      eps=group["eps"], weight_decay=group["weight_decay"],
                      adamw=self.adam_w_mode)
            flat = [t.detach().view(-1) if t.is_contiguous() else None
                    for t in (p, grad, state["exp_avg"], state["exp_avg_sq"])]
            if (p.device.type == "cpu" and None not in flat and p.dtype != torch.float16
                    and low and grad.dtype in (torch.float32, torch.bfloat16)):
                cpu_optim.adam_step(*flat, **kw)  # the compiled op (or its torch fallback)
            else:
                _adam_torch(p, grad, state["exp_avg"], state["exp_avg_sq"], **kw)


def _adam_torch(p, grad, m, v, *, step, lr, beta1, beta2, eps, weight_decay, adamw):
    g = grad.to(m.dtype)
    w = p if p.dtype == m.dtype else p.to(m.dtype)
    if weight_decay:
        if adamw:
            w.mul_(1 - lr * weight_decay)
        else:
            g = g.add(w, alpha=weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
    w.addcdiv_(m, denom, value=-lr / (1 - beta1 ** step))
    if w is not p:
        p.copy_(w)


def build_muon(model_parameters, params: dict, model=None) -> Muon:
    """The config's ``type: Muon``: tag the model's parameters (when given), split, build."""
    if params.get("per_head_muon"):
        raise ValueError("optimizer.params.per_head_muon: per-head Muon is not supported by "
                         "dslaunch yet (each matrix is orthogonalized whole)")
    if model is not None:
        tag_muon_params(model)
    groups = split_param_groups(model_parameters, params)
    return Muon(groups, adam_w_mode=bool(params.get("adam_w_mode", True)))


__all__ = ["Muon", "build_muon", "tag_muon_params", "is_muon_param", "split_param_groups"]
