"""Optimizers by config name, DeepSpeed's way.

- ``Adam`` (also ``FusedAdam``, ``CPUAdam``): DeepSpeed's ``adam_w_mode`` defaults to true, so the
  config type "Adam" means decoupled weight decay (AdamW) unless ``adam_w_mode: false`` (then L2
  weight decay added to the gradient, torch's Adam). ``AdamW`` is always decoupled.
  ``weight_decay`` left out means 0, as DeepSpeed's FusedAdam and DeepSpeedCPUAdam default
  (torch's AdamW would decay by 0.01); with ``torch_adam: true`` DeepSpeed hands the params to
  torch's class, so torch's defaults apply, here too.
- ``SGD``, ``Adagrad``: torch's. ``Lamb``, ``Lion``: small reference implementations here, with
  DeepSpeed's defaults for what the config leaves out (Lion: lr 1e-3, betas (0.9, 0.999), no
  weight decay, as its FusedLion and DeepSpeedCPULion).
- ``Muon``: Muon for the hidden matrices with an auxiliary AdamW for the rest (``muon.py``; the
  model's parameters are tagged ``use_muon`` by DeepSpeed's rule; ZeRO 1-3: ``muon_zero.py``).
- ``OneBitAdam``, ``ZeroOneAdam``, ``OneBitLamb``: ``engine/optim/onebit/`` (``build_onebit``).
- Any other name: the ``torch.optim`` class of that name (case-insensitive), params passed as is.
torch's fused kernels are used where torch has them for the device (Adam/AdamW ``fused=True`` is
about 5x the foreach path on CPU here); otherwise torch's default (foreach).
A user-passed optimizer is used as is (``dslaunch.initialize(optimizer=...)``).
"""

from __future__ import annotations

import torch

from dslaunch.engine.optim.lamb import Lamb
from dslaunch.engine.optim.lion import Lion
from dslaunch.engine.optim.muon import Muon, build_muon
from dslaunch.engine.optim.onebit import build_onebit

# DeepSpeed-only knobs that are not torch keyword arguments
_DS_ONLY = ("adam_w_mode", "torch_adam", "bias_correction", "legacy_fusion", "max_grad_norm")


def _clean(params: dict) -> dict:
    return {k: (tuple(v) if k == "betas" else v) for k, v in params.items() if v is not None}


def _first_device(model_parameters):
    for item in model_parameters:
        if isinstance(item, dict):
            for p in item["params"]:
                return p.device
        else:
            return item.device
    return torch.device("cpu")


def build_optimizer(model_parameters, optimizer_cfg, model=None) -> torch.optim.Optimizer:
    """``optimizer_cfg``: the config's typed ``optimizer`` section (``.type``, ``.params``);
    ``model``: the model the parameters belong to (Muon tags its parameters by name)."""
    model_parameters = list(model_parameters)
    name = str(optimizer_cfg.type)
    kind = name.lower()
    params = _clean(dict(optimizer_cfg.params or {}))
    device = _first_device(model_parameters)

    if kind in ("adam", "adamw", "fusedadam", "cpuadam"):
        adam_w_mode = True if kind == "adamw" else bool(params.get("adam_w_mode", True))
        if params.get("bias_correction", True) is False:
            raise ValueError(f"optimizer.params.bias_correction: false is not supported for {name}")
        kw = {k: v for k, v in params.items() if k not in _DS_ONLY}
        if not params.get("torch_adam", False):
            kw.setdefault("weight_decay", 0.0)  # DeepSpeed's fused / CPU Adam default
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        if device.type in ("cpu", "cuda") and "fused" not in kw and "foreach" not in kw:
            kw["fused"] = True
        return cls(model_parameters, **kw)
    if kind in ("onebitadam", "zerooneadam", "onebitlamb"):  # 1-bit optimizers: engine/optim/onebit/
        return build_onebit(model_parameters, name, params)
    if kind == "muon":
        return build_muon(model_parameters, params, model)
    if kind == "lamb":
        kw = {k: v for k, v in params.items() if k not in ("legacy_fusion",)}
        return Lamb(model_parameters, **kw)
    if kind == "lion":
        kw = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.0}  # DeepSpeed's Lion defaults
        kw.update({k: v for k, v in params.items() if k in kw})
        return Lion(model_parameters, **kw)
    if kind == "sgd":
        return torch.optim.SGD(model_parameters, **{k: v for k, v in params.items()
                                                    if k not in _DS_ONLY})
    for attr in dir(torch.optim):
        cls = getattr(torch.optim, attr)
        if (attr.lower() == kind and isinstance(cls, type)
                and issubclass(cls, torch.optim.Optimizer)):
            return cls(model_parameters, **{k: v for k, v in params.items() if k not in _DS_ONLY})
    raise ValueError(f"optimizer.type: unknown optimizer {name!r} (DeepSpeed's names: Adam, AdamW, "
                     "SGD, Lamb, Adagrad, Lion, Muon; or any torch.optim class)")


__all__ = ["build_optimizer", "Lamb", "Lion", "Muon"]
