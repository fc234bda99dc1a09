"""PyTorch-style backward: ``loss.backward()`` on what the engine's forward returned, instead of
``engine.backward(loss)`` (DeepSpeed accepts both since 0.18.3; its bf16 master-weights example
calls ``loss.backward()``).

The engine's forward hooks every output tensor that needs a gradient. When a backward that the
engine did not start reaches one of them, the first such hook of that backward does what
``engine.backward`` does before autograd runs (is this an accumulation boundary? tell the ZeRO
strategy) and queues, for the end of that backward, what it does after (the strategy reduces the
gradients at a boundary). Each hooked output's gradient is divided by the accumulation steps, as
``engine.backward`` divides the loss. Inside ``engine.backward`` the hooks stand aside.

A loss scale (fp16) must be applied by the caller: ``engine.scale(loss).backward()``; a plain
``loss.backward()`` there is an error, as in DeepSpeed, since the step would unscale gradients
that were never scaled.
"""

from __future__ import annotations

import torch


def _tensors(obj):
    """The tensors of a forward's output: a tensor, or tuples / lists / dicts (ModelOutput is a
    dict) of them, nested."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)


class DirectBackward:
    """One per engine. ``engine_backward()`` marks the engine's own backward; ``attach(out)``
    hooks a forward's outputs; ``scaled()`` records that the caller applied the loss scale."""

    def __init__(self, engine):
        self.engine = engine
        self.inside_engine_backward = False
        self._boundary = None  # not None while a direct backward runs: its boundary
        self._scaled = False

    def attach(self, output) -> None:
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(self._on_grad)

    def scaled(self) -> None:
        self._scaled = True

    def _on_grad(self, grad):
        if self.inside_engine_backward:
            return None  # engine.backward scaled the loss and reduces itself
        if self._boundary is None:
            self._begin()
        return grad / self.engine.gradient_accumulation_steps()

    def _begin(self) -> None:
        engine = self.engine
        if engine.precision.scaler.loss_scale != 1.0 and not self._scaled:
            raise RuntimeError(
                "loss.backward() called directly while the config scales the loss (fp16): "
                "use engine.backward(loss), or engine.scale(loss).backward()")
        self._boundary = engine._reduces_gradients()
        engine.strategy.prepare_backward(self._boundary)
        torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _end(self) -> None:
        boundary, self._boundary, self._scaled = self._boundary, None, False
        self.engine.strategy.after_backward(boundary)
