"""Progressive layer drop (PLD, Zhang & He 2020, "Accelerating Training of Transformer-Based
Language Models with Progressive Layer Dropping"): the ``progressive_layer_drop`` config section.

The engine does not drop layers itself: the model does, as in DeepSpeed. While the model trains,
every forward gets two keyword arguments, ``progressive_layer_drop=True`` and ``pld_theta``, the
keep probability of the schedule at this point: theta(t) = (1 - theta_bar) * exp(-gamma * t) +
theta_bar, falling from 1 towards the config's ``theta`` (theta_bar) at the rate ``gamma``. A
model layer keeps its block with a probability derived from ``pld_theta`` (the paper scales it by
depth). The schedule moves at each optimizer step, before the step, with t = the number of steps
completed before it (DeepSpeed's order): the forwards of step 0 and 1 see theta 1, those of step
k >= 1 see theta(k - 1). Public as ``dslaunch.runtime.progressive_layer_drop.ProgressiveLayerDrop``.
"""

from __future__ import annotations

import math

from dslaunch.engine.base.log import log_dist


class ProgressiveLayerDrop:
    def __init__(self, theta: float = 0.5, gamma: float = 0.001):
        self.theta = theta
        self.gamma = gamma
        self.current_theta = 1.0
        log_dist(f"progressive layer drop: keep probability 1 -> {theta} at rate {gamma} per step",
                 ranks=[0])

    def get_state(self) -> dict:
        """The keyword arguments each training forward gets."""
        return {"progressive_layer_drop": True, "pld_theta": self.get_theta()}

    def get_theta(self) -> float:
        return self.current_theta

    def update_state(self, global_step: int) -> None:
        """The schedule at ``global_step`` steps completed."""
        self.current_theta = ((1.0 - self.theta) * math.exp(-self.gamma * global_step)
                              + self.theta)
