"""Progressive layer drop (``engine/features/progressive_layer_drop.py``; DeepSpeed removed the section in
0.19, dslaunch keeps it): configs/progressive_layer_drop.json on tests/scripts/pld_rank.py, one
rank. Every training forward gets ``progressive_layer_drop=True`` and the schedule's theta, which
moves once per optimizer step, before it (theta 1 for the forwards of steps 0 and 1, then
(1 - 0.5) * exp(-0.2 * (k - 1)) + 0.5 at step k); an evaluation forward gets nothing.

DeepSpeed 0.18.9, the last release with PLD (its own venv, torch 2.13.0+cpu, torchrun, 1 rank,
the same script with ``--runtime deepspeed`` and this config plus ``"torch_adam": true``, the Adam
dslaunch's engine runs), measured 2026-11-27: the same 12 theta values to the last printed digit
and the same losses, 24.496332 2.829038 3.696796 9.131101 7.319777 9.069393, eval 9.915736.
"""

import math
import re

import pytest

from helpers import ROOT, launch

pytestmark = pytest.mark.slow


def test_every_training_forward_gets_the_schedule(tmp_path):
    proc = launch(tmp_path, None, "pld_rank.py",
                  ["--config", ROOT / "configs" / "progressive_layer_drop.json"], nproc=1)
    thetas = [(int(n), v) for n, v in re.findall(r"THETA (\d+) (\S+)", proc.stdout)]
    assert [n for n, _ in thetas] == list(range(1, 13))  # 6 steps x 2 micro-batches
    for n, value in thetas:
        step = (n - 1) // 2  # the optimizer step this forward belongs to
        want = 1.0 if step == 0 else 0.5 * math.exp(-0.2 * (step - 1)) + 0.5
        assert float(value) == pytest.approx(want, rel=1e-12), (n, value)
    assert "EVAL" in proc.stdout
    losses = [float(v) for v in re.findall(r"LOSS \d+ (\S+)", proc.stdout)]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
