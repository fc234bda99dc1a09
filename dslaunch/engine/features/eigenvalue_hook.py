"""The engine's side of the ``eigenvalue`` config section: at every ``gas_boundary_resolution``-th
accumulation boundary (DeepSpeed's ``gas_boundary_ctr``, counted from the engine's start), before
the optimizer step, the blocks' eigenvalues of the window's loss Hessian (``eigenvalue.py``).

DeepSpeed backpropagates every micro-batch with ``create_graph=True`` and differentiates
``p.grad``. dslaunch's ZeRO strategies move gradients into their own buffers as backward ends,
which would drop that graph, so instead each micro-batch of a window that ends on a computing
boundary first takes the blocks' gradients with graph (``torch.autograd.grad``: one more backward
of that micro-batch), summed over the window as ``p.grad`` would sum them, and its training
backward keeps the graph until the boundary. Windows that do not compute cost nothing.
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.engine.features.eigenvalue import Eigenvalue


class EigenvalueAtBoundaries:
    def __init__(self, section, module, device):
        """``section``: the typed ``eigenvalue`` config section (enabled)."""
        self.eigenvalue = Eigenvalue(
            verbose=section.verbose, max_iter=section.max_iter, tol=section.tol,
            stability=section.stability, gas_boundary_resolution=section.gas_boundary_resolution,
            layer_name=section.layer_name, layer_num=section.layer_num)
        self.module, self.device = module, device
        layers = self.eigenvalue.get_layers(module)
        seen: dict = {}  # the blocks' trainable parameters, once each, in order
        for index in range(section.layer_num):
            for p in layers[index].parameters():
                if p.requires_grad:
                    seen.setdefault(id(p), p)
        self._params = list(seen.values())
        self.boundaries = 0  # DeepSpeed's gas_boundary_ctr
        self.computed = False  # did the last boundary compute?
        self._window: dict = {}  # parameter -> its gradient with graph, summed over the window

    @classmethod
    def from_config(cls, section, module, device):
        return cls(section, module, device) if section.enabled else None

    def _window_computes(self) -> bool:
        return (self.boundaries + 1) % self.eigenvalue.gas_boundary_resolution == 0

    def forward_region(self):
        """Around the forward of a computing window: attention through the math kernel, as the
        fused attention kernels have no second derivative."""
        if not self._window_computes():
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])

    def capture(self, scaled_loss: torch.Tensor) -> bool:
        """Before a micro-batch's training backward: keep the blocks' gradients with graph when
        this window computes; True when the training backward must then retain its graph."""
        if not self._window_computes() or not scaled_loss.requires_grad:
            return False
        grads = torch.autograd.grad(scaled_loss, self._params, create_graph=True,
                                    retain_graph=True, allow_unused=True)
        for p, g in zip(self._params, grads):
            if g is not None:
                earlier = self._window.get(p)
                self._window[p] = g if earlier is None else earlier + g
        return True

    def count_boundary(self) -> bool:
        """At an accumulation boundary: count it; True when it computes."""
        self.boundaries += 1
        self.computed = self.boundaries % self.eigenvalue.gas_boundary_resolution == 0
        if not self.computed:
            self._window = {}
        return self.computed

    def compute(self, loss_scale: float):
        """DeepSpeed's ``block_eigenvalue``: ``{id(param): (value, block)}`` (or ``[]``)."""
        try:
            return self.eigenvalue.compute_eigenvalue(self.module, self.device, loss_scale,
                                                      grads=self._window)
        finally:
            self._window = {}  # frees the retained graphs

    def summary_events(self, block_eigenvalue, global_samples: int) -> list:
        """DeepSpeed's monitor events of a computing boundary: one per block parameter."""
        if not self.computed or not block_eigenvalue:
            return []
        return [(f"Train/Eigenvalues/ModelBlockParam_{i}", value, global_samples)
                for i, (value, _) in enumerate(block_eigenvalue.values())]
