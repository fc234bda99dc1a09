"""DeepSpeedExamples' own training scripts, ported by changing the import and nothing else but
CPU / no-download edits (each copy under tests/deepspeed_examples/ lists its edits at the top;
benchmarks/conformance.py applies the same edits when it runs the originals under DeepSpeed and
dslaunch side by side), run by `dslaunch run` on 2 ranks (gloo), with the examples' own configs
(tests/deepspeed_examples/configs/ are DeepSpeedExamples' training/bf16_master_weight/configs/,
unchanged):

- training/cifar/cifar10_deepspeed.py in fp32 and bf16 (its own in-script config: Adam,
  WarmupLR, clipping, the deprecated ``cpu_offload`` key), and its MoE mode with
  run_ds_moe.sh's flags (``deepspeed.moe.layer.MoE``, expert parallel over both ranks, the
  top-level ``deepspeed.moe.utils`` import of the original);
- training/pipeline_parallelism/train.py: AlexNet's layout in a 2-stage PipelineModule fed by
  ``training_data=`` (``train_batch()`` without a data iterator), and its ``-p 0`` data-parallel
  path;
- training/bf16_master_weight/train.py with both of its configs, baseline.json (bf16, ZeRO-3)
  and bf16_full.json (bf16 master weights, gradients and optimizer states, torch autocast), with
  activation checkpointing (``torch.utils.checkpoint``, non-reentrant) and PyTorch-style
  ``loss.backward()``: the losses DeepSpeed 0.19.8 prints for the same command (measured, below),
  and the same script on one rank without checkpointing.

What the scripts themselves print or write is what is checked: the losses they log. Their
synthetic data has learnable classes (cifar, pipeline), so the loss must fall; the bf16 example's
data is the original's random tokens and random labels, so there the check is DeepSpeed's losses,
the one-rank run and a control run at learning rate 0 (which must differ: the steps change the
weights).

Measured once against DeepSpeed 0.19.8 (CPU, torch 2.13, the same copies with `import deepspeed`
back, started by torchrun on 2 ranks): cifar fp32 prints the same 10 epoch losses to the printed
3 decimals (2.319 ... 2.191) and the same 38 % test accuracy; cifar bf16 agrees within 0.007 per
epoch (2.320 -> 2.188 there, 2.320 -> 2.195 here); the pipeline falls alike (mean of the first /
last 8 steps 2.304 / 1.934 there, 2.303 / 1.968 here; dropout and data order differ). (These
figures predate the restored copies; `benchmarks/conformance.py` measures them again.)
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


MOE_FLAGS = ["--deepspeed", "--moe", "--ep-world-size", "2", "--num-experts", "2", "--top-k", "1",
             "--noisy-gate-policy", "RSample", "--moe-param-group"]  # run_ds_moe.sh's


def test_cifar10_moe_example_learns(tmp_path):
    """The MoE mode as run_ds_moe.sh starts it (2 experts, one per rank, top-1 gating with
    RSample noise, MoE parameter groups), in fp32: ``deepspeed.moe.layer.MoE`` reached through
    ``import deepspeed`` and the original's top-level ``deepspeed.moe.utils`` import."""
    proc = launch(tmp_path, None, HERE / "cifar10_deepspeed.py",
                  ["--dtype", "fp32", "--epochs", "10", "--log-interval", "4", *MOE_FLAGS])
    epochs = _floats(r"\[rank 0\] \[ *\d+, +4\] loss: +([\d.]+)", proc.stdout)
    assert len(epochs) == 10 and all(math.isfinite(v) for v in epochs), proc.stdout[-2000:]
    # the extra MoE layer learns slower under the script's 1000-step warmup: measured 2.304 ->
    # 2.274 over the 10 epochs (40 steps)
    assert epochs[-1] < epochs[0] - 0.015, epochs
    assert all(b <= a + 0.01 for a, b in zip(epochs, epochs[1:])), epochs
    assert proc.stdout.count("Finished Training") == 2


def _pipe_config(tmp_path) -> Path:
    """The example's ds_config.json (tests/deepspeed_examples/ds_config.json, unchanged) with the
    two values benchmarks/conformance.py shortens too: 16 samples a step instead of 256 (2
    micro-batches of 8), and every step's loss printed (the runs are short)."""
    config = json.loads((HERE / "ds_config.json").read_text())
    config.update(train_batch_size=16, steps_per_print=1)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def test_pipeline_example_learns_from_its_training_data(tmp_path):
    proc = launch(tmp_path, None, HERE / "pipeline_train.py",
                  [f"--deepspeed_config={_pipe_config(tmp_path)}", "-p", "2", "--steps", "60",
                   "--backend", "gloo"])
    losses = _floats(r"\[dslaunch\] step +\d+ loss ([\d.]+)", proc.stdout)
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses), proc.stdout[-2000:]
    # 64 samples, 16 a step: each window of 8 steps sees every sample twice; dropout is on.
    # Measured: 2.303 over the first 8 steps, 1.968 over the last 8. Had train_batch() started
    # the loader over each time, it would only see the same 16 samples.
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < first - 0.1, (first, last)


def test_pipeline_example_data_parallel_path(tmp_path):
    proc = launch(tmp_path, None, HERE / "pipeline_train.py",
                  [f"--deepspeed_config={_pipe_config(tmp_path)}", "-p", "0", "--steps", "20",
                   "--backend", "gloo"])
    printed = _floats(r"step: +\d+ / +20 loss: ([\d.]+)", proc.stdout)
    assert len(printed) == 2 and all(math.isfinite(v) for v in printed)


# run_comparison.sh's command on a tiny model (its defaults: batch 4 = the configs' micro-batch)
BF16_ARGS = ["--hidden_dim", "64", "--num_layers", "2", "--num_heads", "2", "--vocab_size", "256",
             "--seq_length", "32", "--num_steps", "6", "--log_interval", "1"]

# DeepSpeed 0.19.8's losses for the same copy (the two cuda guards, `import deepspeed`), the
# original configs and BF16_ARGS + --activation_checkpointing, on 2 CPU ranks started by
# `torchrun --standalone --nproc-per-node 2` in benchmarks/peers.py's venv (torch 2.13.0+cpu,
# OMP_NUM_THREADS=1), read from its --loss_log_file. Measured 2026-11-27, baseline twice with
# checkpointing and once without, bf16_full once with and once without: the same values every
# time (the script seeds every rank alike; the losses are bf16 values, so they compare exactly).
DEEPSPEED_LOSSES = {
    "baseline": [5.71875, 5.65625, 5.75, 5.75, 5.6875, 5.75],
    "bf16_full": [5.71875, 5.65625, 5.75, 5.75, 5.6875, 5.78125],
}


# DEEPSPEED_LOSSES were measured on a CPU without avx512_bf16 (AVX2), where oneDNN has no bf16
# GEMM and torch multiplies bf16 matrices with its own kernels. On a CPU with avx512_bf16 (this
# project's 2026-11-28 host, an AMD EPYC with AVX-512) oneDNN's bf16 kernels take some of our
# matmuls and our step-5 loss (ZeRO 0, 2 and 3 alike) comes out one bf16 rounding higher (5.78125)
# while DeepSpeed's stays 5.75; with ONEDNN_MAX_CPU_ISA=AVX2 both print the values below. Which of
# DeepSpeed's tensors oneDNN passes over (so that its result does not move) is not yet known. The
# runs here pin oneDNN to AVX2, the conditions the reference was measured in, on any host.
BF16_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def _bf16_losses(tmp_path, name, config, nproc=2, extra=()):
    csv = tmp_path / f"{name}.csv"
    launch(tmp_path, None, HERE / "bf16_master_weight_train.py",
           [*BF16_ARGS, "--deepspeed_config", config, "--loss_log_file", csv, *extra],
           nproc=nproc, env=BF16_ENV)
    rows = csv.read_text().split()[1:]
    return [float(r.split(",")[1]) for r in rows]


def test_bf16_master_weight_example_baseline_config(tmp_path):
    """baseline.json (bf16 + ZeRO-3) as the example ships it: the losses DeepSpeed prints, on 2
    ranks with activation checkpointing; and 1 rank without it gives them too (both ranks draw
    the same random batches, so the average gradient is the one rank's)."""
    baseline = CONFIGS / "baseline.json"
    two = _bf16_losses(tmp_path, "two", baseline, extra=["--activation_checkpointing"])
    assert two == DEEPSPEED_LOSSES["baseline"]
    one = _bf16_losses(tmp_path, "one", baseline, nproc=1)
    assert one == two
    frozen = json.loads(baseline.read_text())
    frozen["optimizer"]["params"]["lr"] = 0.0
    (tmp_path / "lr0.json").write_text(json.dumps(frozen))
    assert _bf16_losses(tmp_path, "lr0", tmp_path / "lr0.json") != two


def test_bf16_master_weight_example_low_precision_config(tmp_path):
    """bf16_full.json (bf16 master weights, gradients and optimizer states, torch autocast) as the
    example ships it, on 2 ranks with activation checkpointing: DeepSpeed's losses exactly for
    steps 0-4, and within one bf16 rounding (2**-5 between 4 and 8) at step 5, where we print
    5.75 and DeepSpeed 5.78125. A known difference, not yet explained: the weights, gradients
    and Adam states are all bf16 here, so one element rounded the other way in an optimizer step
    (a likely cause, not confirmed: DeepSpeed's CPU Adam kernel and ours round the bf16 update
    differently) is enough;
    the baseline config (fp32 masters) matches DeepSpeed exactly."""
    losses = _bf16_losses(tmp_path, "full", CONFIGS / "bf16_full.json",
                          extra=["--activation_checkpointing"])
    want = DEEPSPEED_LOSSES["bf16_full"]
    assert len(losses) == len(want) and losses[:5] == want[:5], losses
    assert abs(losses[5] - want[5]) <= 2.0 ** -5, losses
