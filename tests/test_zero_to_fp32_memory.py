"""Consolidation streams: the peak memory of ``zero_to_fp32.py`` on a ZeRO stage 3 checkpoint is
about one fp32 copy of the model, not the model plus every rank's shards.

A ~30M-parameter GPT (fp32, Adam, stage 3 under zero.Init) is trained one step on 2 ranks and
saved by the benchmark's own rank code (benchmarks/bench_zero_to_fp32.py); then the script
``save_checkpoint`` wrote beside it runs as a process of its own, measured as the benchmark
measures: peak RSS = ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of that one process (VmHWM:
anonymous memory and the mapped checkpoint pages it touched). Bound: 1.3x the fp32 model
(4 bytes x parameters) + the peak RSS of an idle python that imports torch, measured the same way.
Reading the whole checkpoint (16 bytes x parameters here) or keeping each rank's shard mapped
would break it.
"""

import sys

import torch

from helpers import ROOT, launch

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_zero_to_fp32 import CONFIG, measure

MODEL = ["--layers", "4", "--d-model", "640", "--vocab", "8192"]


def test_zero_to_fp32_peak_rss_is_about_one_fp32_model(tmp_path):
    ck = tmp_path / "ck"
    launch(tmp_path, CONFIG, ROOT / "benchmarks" / "bench_zero_to_fp32.py",
           ["--rank", "dslaunch", ck, *MODEL], timeout=300)
    out = tmp_path / "fp32.pt"
    run = measure([sys.executable, ck / "zero_to_fp32.py", ck, out])
    idle = measure([sys.executable, "-c", "import torch"])
    state = torch.load(out, weights_only=True, mmap=True)
    params = sum(v.numel() for v in state.values())
    assert params > 25_000_000 and all(v.dtype == torch.float32 for v in state.values())
    fp32 = 4 * params
    bound = 1.3 * fp32 + idle["peak_rss_bytes"]
    assert run["peak_rss_bytes"] <= bound, (
        f"peak RSS {run['peak_rss_bytes'] / 2**20:.0f} MiB > 1.3 x {fp32 / 2**20:.0f} MiB + idle "
        f"{idle['peak_rss_bytes'] / 2**20:.0f} MiB")
