"""DeepSpeedExamples' own training scripts, ported by changing the import and nothing else but
CPU / no-download edits (each copy under tests/deepspeed_examples/ lists its edits at the top), run
by `dslaunch run` on 2 ranks (gloo):

- training/cifar/cifar10_deepspeed.py in fp32 and bf16 (its own in-script config: Adam,
  WarmupLR, clipping, the deprecated ``cpu_offload`` key);
- training/pipeline_parallelism/train.py: AlexNet's layout in a 2-stage PipelineModule fed by
  ``training_data=`` (``train_batch()`` without a data iterator), and its ``-p 0`` data-parallel
  path;
- training/bf16_master_weight/train.py: bf16, ZeRO-3, activation checkpointing
  (``torch.utils.checkpoint``, non-reentrant) and PyTorch-style ``loss.backward()``, equal to the
  same script on one rank without checkpointing; its low-precision config waits for issue 18
  part 4.

What the scripts themselves print is what is checked: the losses they log. Their synthetic data
has learnable classes (cifar, pipeline), so the loss must fall; the bf16 example's data is the
original's random tokens and random labels, so there the check is the one-rank reference and a
control run at learning rate 0 (which must differ: the steps change the weights).

Measured once against DeepSpeed 0.19.8 (CPU, torch 2.13, the same copies with `import deepspeed`
back, started by torchrun on 2 ranks): cifar fp32 prints the same 10 epoch losses to the printed
3 decimals (2.319 ... 2.191) and the same 38 % test accuracy; cifar bf16 agrees within 0.007 per
epoch (2.320 -> 2.188 there, 2.320 -> 2.195 here); the bf16 master-weight baseline (ZeRO-3,
checkpointing, loss.backward()) gives the same 12 losses; the pipeline falls alike (mean of the
first / last 8 steps 2.304 / 1.934 there, 2.303 / 1.968 here; dropout and data order differ).

The MoE run of the cifar script is not run here: its top-level `deepspeed.moe.utils` import is
moved into the MoE branch in the copy; the import itself resolves to dslaunch's (checked below).
"""

import json
import math
import re
from pathlib import Path

import pytest

from helpers import launch

HERE = Path(__file__).resolve().parent / "deepspeed_examples"
CONFIGS = HERE / "configs"


def _floats(pattern, text) -> list:
    return [float(v) for v in re.findall(pattern, text)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cifar10_example_learns(tmp_path, dtype):
    proc = launch(tmp_path, None, HERE / "cifar10_deepspeed.py",
                  ["--dtype", dtype, "--epochs", "10", "--log-interval", "4"])
    # rank 0 prints its mean loss over the epoch's 4 micro-batches (the same samples each epoch)
    epochs = _floats(r"\[rank 0\] \[ *\d+, +4\] loss: +([\d.]+)", proc.stdout)
    assert len(epochs) == 10 and all(math.isfinite(v) for v in epochs), proc.stdout[-2000:]
    assert epochs[-1] < epochs[0] - 0.05, epochs  # measured: fp32 2.319 -> 2.191, bf16 -> 2.195
    assert all(b <= a + 0.01 for a, b in zip(epochs, epochs[1:])), epochs
    assert proc.stdout.count("Finished Training") == 2
    assert "Accuracy of the network on the 40 test images" in proc.stdout


def test_cifar10_moe_import_resolves():
    from dslaunch.engine.moe import params
    from dslaunch.moe.utils import split_params_into_different_moe_groups_for_optimizer

    assert split_params_into_different_moe_groups_for_optimizer is (
        params.split_params_into_different_moe_groups_for_optimizer)


PIPE_CONFIG = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8,  # 512 / 256 shrunk
               "optimizer": {"type": "Adam",
                             "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
               "steps_per_print": 1, "wall_clock_breakdown": False}


def test_pipeline_example_learns_from_its_training_data(tmp_path):
    proc = launch(tmp_path, PIPE_CONFIG, HERE / "pipeline_train.py",
                  ["-p", "2", "--steps", "60", "--backend", "gloo"],
                  config_flag="--deepspeed_config")
    losses = _floats(r"\[dslaunch\] step +\d+ loss ([\d.]+)", proc.stdout)
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses), proc.stdout[-2000:]
    # 64 samples, 16 a step: each window of 8 steps sees every sample twice; dropout is on.
    # Measured: 2.303 over the first 8 steps, 1.968 over the last 8. Had train_batch() started
    # the loader over each time, it would only see the same 16 samples.
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < first - 0.1, (first, last)


def test_pipeline_example_data_parallel_path(tmp_path):
    proc = launch(tmp_path, PIPE_CONFIG, HERE / "pipeline_train.py",
                  ["-p", "0", "--steps", "20", "--backend", "gloo"],
                  config_flag="--deepspeed_config")
    printed = _floats(r"step: +\d+ / +20 loss: ([\d.]+)", proc.stdout)
    assert len(printed) == 2 and all(math.isfinite(v) for v in printed)


BF16_ARGS = ["--hidden_dim", "32", "--num_layers", "2", "--num_heads", "4", "--vocab_size", "64",
             "--batch_size", "2", "--seq_length", "16", "--num_steps", "12", "--log_interval", "1"]


def _bf16_losses(tmp_path, name, config, nproc=2, extra=()):
    csv = tmp_path / f"{name}.csv"
    launch(tmp_path, None, HERE / "bf16_master_weight_train.py",
           [*BF16_ARGS, "--deepspeed_config", config, "--loss_log_file", csv, *extra],
           nproc=nproc)
    rows = csv.read_text().split()[1:]
    return [float(r.split(",")[1]) for r in rows]


def test_bf16_master_weight_example_zero3_with_checkpointing(tmp_path):
    """The baseline config (bf16 + ZeRO-3): 2 ranks with activation checkpointing against 1 rank
    without. Both ranks draw the same random batches (the script seeds every rank alike), so the
    average gradient is the one rank's and the losses must agree exactly."""
    baseline = CONFIGS / "baseline.json"
    two = _bf16_losses(tmp_path, "two", baseline, extra=["--activation_checkpointing"])
    one = _bf16_losses(tmp_path, "one", baseline, nproc=1)
    assert len(two) == 12 and all(math.isfinite(v) for v in two)
    assert two == one
    frozen = json.loads(baseline.read_text())
    frozen["optimizer"]["params"]["lr"] = 0.0
    (tmp_path / "lr0.json").write_text(json.dumps(frozen))
    assert _bf16_losses(tmp_path, "lr0", tmp_path / "lr0.json") != two


def test_bf16_master_weight_example_low_precision_config(tmp_path):
    losses = _bf16_losses(tmp_path, "full", CONFIGS / "bf16_full.json",
                          extra=["--activation_checkpointing"])
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
