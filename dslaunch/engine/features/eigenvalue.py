"""DeepSpeed's ``Eigenvalue`` (``deepspeed.runtime.eigenvalue``): per block of the model, the
dominant eigenvalue of the loss Hessian restricted to that block's parameters, by power iteration
on Hessian-vector products. DeepSpeed's MoQ used it to slow the quantization of sensitive layers.

Semantics are DeepSpeed's (0.18/0.19), so the numbers mean the same thing:

- the blocks are ``module.<layer_name>[0 .. layer_num-1]``;
- a block's Hessian-vector product differentiates the block's gradients, which must carry their
  autograd graph (``p.grad`` from a ``create_graph=True`` backward, or ``grads=``);
- the start vector is ``randn`` from the current CPU random state, which is left untouched (every
  block starts from the same draw);
- iteration stops after ``max_iter`` products, or when the relative change is below ``tol``;
- ``scale`` (the loss scale the gradients carry) is divided out as DeepSpeed does;
- the result maps ``id(param)`` of every block parameter to ``(value, block_index)``, where
  ``value`` is ``|eigenvalue| / max |eigenvalue|`` over the blocks (a zero eigenvalue reads 1.0);
  a model whose gradients carry no graph gets ``[]`` and a warning.

``block_eigenvalues`` (dslaunch's) gives the raw values, before that normalisation.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional

import torch

from dslaunch.engine.base.log import log_dist


class Eigenvalue:
    def __init__(self, verbose=False, max_iter=100, tol=1e-2, stability=0,
                 gas_boundary_resolution=1, layer_name="", layer_num=0):
        if not layer_name or layer_num <= 0:
            raise ValueError(f"Eigenvalue: layer_name must name the model's list of blocks and "
                             f"layer_num must be > 0 (got layer_name={layer_name!r}, "
                             f"layer_num={layer_num})")
        self.verbose = verbose
        self.max_iter = max_iter
        self.tol = tol
        self.stability = stability
        self.gas_boundary_resolution = gas_boundary_resolution
        self.layer_name = layer_name
        self.layer_num = layer_num
        log_dist(f"enabled eigenvalue with verbose={verbose}, max_iter={max_iter}, tol={tol}, "
                 f"stability={stability}, gas_boundary_resolution={gas_boundary_resolution}, "
                 f"layer_name={layer_name}, layer_num={layer_num}", ranks=[0])

    # -- vector helpers (a vector is a list of tensors, one per parameter) ------------------------
    @staticmethod
    def nan_to_num(x: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)

    @staticmethod
    def inner_product(xs, ys) -> torch.Tensor:
        return sum(torch.sum(x * y) for x, y in zip(xs, ys))

    def normalize(self, v: list) -> list:
        norm = self.inner_product(v, v) ** 0.5 + self.stability
        return [self.nan_to_num(x / norm) for x in v]

    # -- blocks ----------------------------------------------------------------------------------
    def get_layers(self, module):
        """``module.<layer_name>``: the indexable list of blocks."""
        node, walked = module, []
        for name in self.layer_name.split("."):
            if not hasattr(node, name):
                where = ".".join(walked) or type(module).__name__
                raise ValueError(f"eigenvalue.layer_name {self.layer_name!r}: {where} has no "
                                 f"attribute {name!r}")
            node = getattr(node, name)
            walked.append(name)
        return node

    def compute_eigenvalue(self, module, device=None, scale=1.0,
                           grads: Optional[Mapping] = None):
        """``{id(param): (normalised eigenvalue, block index)}`` for every parameter of the
        blocks, or ``[]`` when the gradients carry no graph. ``grads``: parameter -> its
        gradient with graph (dslaunch's engine passes them; default ``p.grad``, DeepSpeed's)."""
        values, block_params = self._raw(module, device, scale, grads)
        if values is None:
            return []
        normalised = self.post_process(values)
        if self.verbose:
            log_dist(f"post processed block_eigenvalue: {normalised}", ranks=[0])
        return {id(p): (value, index) for index, (params, value)
                in enumerate(zip(block_params, normalised)) for p in params}

    def block_eigenvalues(self, module, device=None, scale=1.0,
                          grads: Optional[Mapping] = None) -> list:
        """The raw dominant eigenvalue of each block (signed, unnormalised); ``[]`` as above."""
        values, _ = self._raw(module, device, scale, grads)
        return values or []

    def _raw(self, module, device, scale, grads):
        layers = self.get_layers(module)
        values, block_params = [], []
        for index in range(self.layer_num):
            params = list(layers[index].parameters())
            block_params.append(params)
            pairs = [(p, g) for p in params
                     if (g := (p.grad if grads is None else grads.get(p))) is not None
                     and g.grad_fn is not None]
            if not pairs:  # e.g. a fused kernel without second derivatives
                log_dist("The model does NOT support eigenvalue computation.", ranks=[0],
                         level=logging.WARNING)
                return None, block_params
            value, iterations = self._power_iteration(pairs, device, scale)
            values.append(value)
            if self.verbose:
                log_dist(f"block: {index}, power iteration: {iterations}, eigenvalue: {value}",
                         ranks=[0])
        return values, block_params

    def _power_iteration(self, pairs, device, scale):
        params = [p for p, _ in pairs]
        grads = [g for _, g in pairs]
        # DeepSpeed's start vector: randn from the CPU random state, which stays as it was
        draw = torch.Generator().set_state(torch.random.get_rng_state())
        v = [torch.randn(p.size(), generator=draw).to(device or p.device) for p in params]
        v = self.normalize(v)
        current, previous, i = 1.0, 0.0, 0
        while (i < self.max_iter and abs(current) > 0
               and abs((current - previous) / current) >= self.tol):
            previous = current
            hv = torch.autograd.grad(grads, params, grad_outputs=[x.to(g.dtype) for x, g in
                                                                  zip(v, grads)],
                                     retain_graph=True)
            hv = [self.nan_to_num(h).float() for h in hv]
            current = self.inner_product(hv, v).item()
            # the gradients carry the loss scale: the next product is divided by it once more
            v = [x / scale for x in self.normalize(hv)]
            i += 1
        return current * scale, i

    @staticmethod
    def post_process(values: list) -> list:
        """Each |value| over the largest |value| (in [0, 1]); a zero (an fp16 block that gave no
        valid eigenvalue) reads 1.0."""
        largest = abs(max(values, key=abs))
        return [abs(v) / largest if v != 0.0 else 1.0 for v in values]
