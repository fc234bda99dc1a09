"""engine/base/step_policy.py: the overflow / clip / step decision every strategy and the pipeline
use (pure logic; the strategies' arithmetic is checked bit for bit by
benchmarks/loss_fingerprint.py)."""

import math

import torch

from dslaunch.engine.base.precision import DynamicLossScaler, LossScaler
from dslaunch.engine.base.step_policy import (
    MODEL_PARALLEL,
    REPLICATED,
    SHARDED,
    GradNorm,
    all_reduce_sq_norm,
    clip_coefficient,
    sum_of_squares,
)


def test_clip_coefficient_is_torchs_rule():
    assert clip_coefficient(2.0, 1.0) == 1.0 / (2.0 + 1e-6)
    assert clip_coefficient(0.5, 1.0) == 1.0  # below the limit: untouched
    for off in (0.0, None, -1.0):
        assert clip_coefficient(5.0, off) == 1.0
    assert clip_coefficient(math.inf, 1.0) == 1.0 and clip_coefficient(math.nan, 1.0) == 1.0
    w = torch.nn.Parameter(torch.zeros(4))
    w.grad = torch.full((4,), 3.0)
    norm = float(torch.nn.utils.clip_grad_norm_([w], 1.0))
    assert torch.equal(w.grad, torch.full((4,), 3.0) * clip_coefficient(norm, 1.0))


def test_overflow_skips_and_lowers_the_scale():
    scaler = DynamicLossScaler(init_scale=2.0**10, hysteresis=1)
    d = REPLICATED.decide(GradNorm.from_scaled(math.inf, 2.0**10), 1.0, scaler, fp16=True)
    assert d.skip and d.grad_norm is None and scaler.loss_scale == 2.0**9


def test_which_nonfinite_norms_skip():
    # every path, every precision, clipping on or off (tests/test_nonfinite_grad_skip.py runs it)
    nan = GradNorm(math.nan, overflow=True)
    for policy in (REPLICATED, SHARDED, MODEL_PARALLEL):
        for clip in (1.0, 0.0):
            for fp16 in (False, True):
                d = policy.decide(nan, clip, LossScaler(), fp16=fp16)
                assert d.skip and d.grad_norm is None


def test_coefficient_folds_the_unscale_as_each_path_did():
    scaler = LossScaler(1000.0)
    norm = GradNorm(4.0)
    clip = clip_coefficient(4.0, 1.0)
    assert REPLICATED.decide(norm, 1.0, scaler).coef == clip / 1000.0
    assert SHARDED.decide(norm, 1.0, scaler).coef == clip * (1.0 / 1000.0)
    assert MODEL_PARALLEL.decide(norm, 1.0, scaler).coef == clip
    d = REPLICATED.decide(GradNorm(), 0.0, scaler)  # norm not needed: unscale only
    assert (d.skip, d.grad_norm, d.coef) == (False, None, 1.0 / 1000.0)
    assert SHARDED.decide(norm, 1.0, None).coef == clip  # no scaler: scale 1


def test_needs_norm_only_for_clipping_or_fp16():
    # asked only by the 1-bit optimizers' local steps (their own extra collective)
    assert not REPLICATED.needs_norm(0.0, False) and not REPLICATED.needs_norm(None, False)
    assert REPLICATED.needs_norm(1.0, False) and REPLICATED.needs_norm(0.0, True)


def test_stepped_counts_a_good_step():
    scaler = DynamicLossScaler(init_scale=4.0, scale_window=1)
    REPLICATED.stepped(scaler)
    REPLICATED.stepped(None)  # strategies built without a scaler
    assert scaler.cur_iter == 1


def test_sum_of_squares_and_the_reduced_flag():
    ts = [torch.tensor([3.0, 4.0]), torch.tensor([1.0], dtype=torch.bfloat16)]
    assert sum_of_squares(ts) == 26.0
    assert all_reduce_sq_norm(26.0, lambda buf: None) == (26.0, False)
    seen = []
    assert all_reduce_sq_norm(math.inf, seen.append) == (0.0, True)
    assert seen[0].dtype == torch.float64
