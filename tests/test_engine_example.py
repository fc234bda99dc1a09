"""The README's main job, shrunk: examples/train_gpt.py on 2 ranks through `dslaunch run` with
configs/gpt_small.json, saving a checkpoint and resuming from it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DSLAUNCH = str(Path(sys.executable).parent / "dslaunch")
SMALL = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--seq-len", "32",
         "--data-bytes", str(1 << 20), "--log-every", "5"]


def _run(*args):
    proc = subprocess.run([DSLAUNCH, "run", "--nproc-per-node", "2", "--omp-threads", "1",
                           "examples/train_gpt.py", "--config", "configs/gpt_small.json",
                           *SMALL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_example_trains_saves_and_resumes(tmp_path):
    out = _run("--steps", "10", "--checkpoint-dir", str(tmp_path), "--save-every", "5")
    losses = [float(x) for x in re.findall(r"step +\d+ \| loss ([\d.]+)", out)]
    assert len(losses) == 2 and losses[-1] < 5.5  # started at ~ln(256) = 5.55
    assert re.search(r"done: 10 steps in [\d.]+s, [\d,]+ tokens/s", out)
    assert (tmp_path / "latest").read_text() == "global_step10"
    out = _run("--steps", "12", "--checkpoint-dir", str(tmp_path), "--resume")
    assert f"resumed from {tmp_path / 'global_step10'} at step 10" in out
    assert "done: 2 steps" in out
