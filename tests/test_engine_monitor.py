"""CSV monitor content, the tensorboard section's clear error when the package is missing, the
wall-clock breakdown line, and memory_breakdown on one process."""

import csv
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dslaunch
from gpt import GPT, GPTConfig


def _engine(**extra):
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    cfg = {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.1,
                                                           "lr_range_test_step_size": 1}},
           "steps_per_print": 2, **extra}
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    return engine


def _train(engine, steps):
    losses = []
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        loss = engine(tok, tok)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_csv_monitor_writes_loss_and_lr_per_step(tmp_path, capsys):
    e = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "job"},
                wall_clock_breakdown=True)
    losses = _train(e, 3)
    d = tmp_path / "job"
    rows = list(csv.reader(open(d / "Train_Samples_train_loss.csv")))
    assert rows[0] == ["step", "train_loss"]
    assert [int(r[0]) for r in rows[1:]] == [2, 4, 6]  # global samples
    assert [float(r[1]) for r in rows[1:]] == pytest.approx(losses)
    lr_rows = list(csv.reader(open(d / "Train_Samples_lr.csv")))
    assert [float(r[1]) for r in lr_rows[1:]] == pytest.approx([0.2, 0.3, 0.4])  # after each step
    out = capsys.readouterr().out
    assert "[dslaunch] step 2 loss" in out and "time (ms) | forward:" in out


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None,
                    reason="tensorboard installed: the missing-package error cannot happen")
def test_tensorboard_without_package_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="tensorboard package is not installed"):
        _engine(tensorboard={"enabled": True, "output_path": str(tmp_path)})


def test_memory_breakdown_single_process():
    e = _engine()
    n = sum(p.numel() for p in e.module.parameters())
    mem = e.memory_breakdown()
    assert mem["params"] == {"cpu": 4 * n} and mem["grads"] == {"cpu": 4 * n}
    assert mem["optimizer"] == {}  # SGD without momentum holds no state
    assert e.comm_stats() == {}  # one rank: nothing crosses the wire
