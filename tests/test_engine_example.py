"""The README's main job, shrunk: examples/train_gpt.py on 2 ranks through `dslaunch run` with
configs/gpt_small.json, saving a checkpoint and resuming from it.

That it learns is checked against a reference computed here: the same model (same seed, config
and data) untrained, on the very batch whose loss the job prints. An engine that never stepped,
or a resume that started from fresh weights, prints about that reference.
Measured on this job (CPU, torch 2.13): the untrained model's loss on the batches of steps 1-12
(rank 0's rows) lies in 5.532-5.552 (spread 0.02); the job prints 5.5139 at step 5, 5.3113 at
step 10, and 5.3161 at step 12 after the resume, i.e. 0.235 and 0.236 below the untrained loss
on the same batch. The bound, LEARNED = 0.1, keeps more than 2x margin below what is measured
and 5x above the untrained batch-to-batch spread. (Warm-up is 20 steps from lr 0, so at step 5
the model has barely moved: 0.028 below; that step is not bounded.)
"""

import re
import sys

import torch

from helpers import EXAMPLES, dslaunch

SMALL = {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 32, "data_bytes": 1 << 20}
ARGS = [a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))]
LEARNED = 0.1  # the job's loss must be this far below the untrained model's on the same batch


def _run(*args):
    proc = dslaunch("run", "--nproc-per-node", "2", "--omp-threads", "1",
                    "examples/train_gpt.py", "--config", "configs/gpt_small.json",
                    *ARGS, "--log-every", "5", *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _losses(out) -> dict:
    return {int(s): float(v) for s, v in re.findall(r"step +(\d+) \| loss ([\d.]+)", out)}


def _untrained_losses(steps) -> dict:
    """What the example prints at ``step`` had it never updated the weights: the freshly built
    model (seed 0, as train_gpt.py builds it) on rank 0's micro-batch of that step (micro 4 x 2
    ranks, accumulation 1: the loss printed is rank 0's only micro-batch)."""
    sys.path.insert(0, str(EXAMPLES))
    from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=SMALL["seq_len"], n_layer=SMALL["n_layer"],
                          n_head=SMALL["n_head"], d_model=SMALL["d_model"]))
    data = TextBatches(stdlib_bytes(SMALL["data_bytes"]), seq_len=SMALL["seq_len"],
                       global_batch=8, seed=0)
    with torch.no_grad():
        return {s: model(*data.batch_at(s - 1, 0, 2)).item() for s in steps}


def test_example_trains_saves_and_resumes(tmp_path):
    out = _run("--steps", "10", "--checkpoint-dir", str(tmp_path), "--save-every", "5")
    losses = _losses(out)
    assert sorted(losses) == [5, 10]
    assert re.search(r"done: 10 steps in [\d.]+s, [\d,]+ tokens/s", out)
    assert (tmp_path / "latest").read_text() == "global_step10"
    out = _run("--steps", "12", "--checkpoint-dir", str(tmp_path), "--resume")
    assert f"resumed from {tmp_path / 'global_step10'} at step 10" in out
    assert "done: 2 steps" in out
    resumed = _losses(out)
    assert sorted(resumed) == [12]
    untrained = _untrained_losses([10, 12])
    # it learned (measured 0.235 below), and the resumed job continued from the trained weights
    # (measured 0.236 below; 2 steps from fresh weights would print about the untrained loss)
    assert losses[10] < untrained[10] - LEARNED, (losses, untrained)
    assert resumed[12] < untrained[12] - LEARNED, (resumed, untrained)
