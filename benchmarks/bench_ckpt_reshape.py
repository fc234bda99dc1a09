#!/usr/bin/env python
"""Memory of reshaping a ZeRO stage 3 checkpoint: offline (`dslaunch ckpt reshape`, `ckpt to-fp32`)
and automatic (load_checkpoint in a job with another world size).

The BENCHMARKING model (examples/gpt.py ``bench_config()``, 27.4M params, fp32, AdamW) is trained
one step with ZeRO stage 3 on 2 ranks and saved (built under ``dslaunch.zero.Init``, so no rank
holds it whole). Then, each in its own process(es):

- ``ckpt reshape`` to 4 ranks and ``ckpt to-fp32``: peak anonymous RSS (RssAnon sampled every
  5 ms; mmap'd checkpoint pages are file-backed, shared and reclaimable, so they are not in it)
  and peak RSS (VmHWM, file pages included), minus a process that only imports the same modules;
  glibc's ``MALLOC_MMAP_THRESHOLD_`` is fixed so that what is freed leaves the process;
- a 4-rank stage 3 job (model under zero.Init) that loads the 2-rank checkpoint: per rank, the
  growth of anonymous RSS across ``load_checkpoint``.

Units: the fp32 model size 4Ψ, and the checkpoint's bytes on disk (16Ψ: fp32 weights in
model_states.pt + fp32 masters and two Adam moments in the rank files). A streaming reshape needs
about one new rank's shard set (12Ψ/M) plus buffers; to-fp32 about its output (4Ψ).

    .venv/bin/python benchmarks/bench_ckpt_reshape.py [--out-dir benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "peer_scripts"))

CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3}}
DSLAUNCH = str(Path(sys.executable).with_name("dslaunch"))
# glibc's mmap threshold fixed (as bench_nvme_offload.py does): freed blocks leave the process, so
# the peaks are what was live, not what the allocator kept after a free
ENV = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """Samples RssAnon of ``pid`` every 5 ms in a thread: .peak bytes."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, _status(self.pid, "RssAnon"))
            except (OSError, ValueError):
                return
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def _measure(cmd: list) -> dict:
    """Run ``cmd`` (a python -c that waits for a line on stdin before exiting, so VmHWM can be
    read): its peak RssAnon and VmHWM."""
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env=ENV)
    peak = PeakAnon(p.pid)
    line = p.stdout.readline()  # "done" once the work is finished
    hwm = _status(p.pid, "VmHWM")
    anon = peak.stop()
    p.communicate("\n", timeout=60)
    assert line.strip() == "done" and p.returncode == 0, (cmd, line)
    return {"peak_anon_bytes": anon, "peak_rss_bytes": hwm}


def _py(code: str) -> list:
    return [sys.executable, "-c", code + "\nprint('done', flush=True); input()"]


# -- rank scripts (this file, run by `dslaunch run`) -------------------------------------------------

def rank_main(mode: str, ckpt: str) -> None:
    import torch
    import torch.distributed as dist

    import dslaunch
    from examples.gpt import GPT, TextBatches, bench_config, stdlib_bytes

    dslaunch.init_distributed()
    torch.manual_seed(0)
    with dslaunch.zero.Init(config_dict_or_path=CONFIG):
        model = GPT(bench_config())
    engine, *_ = dslaunch.initialize(model=model, config=CONFIG)
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "save":
        batches = TextBatches(stdlib_bytes(1 << 20), seq_len=128, global_batch=8)
        for m in range(engine.gradient_accumulation_steps()):
            tok, tgt = batches.batch_at(m, rank, world)
            engine.backward(engine(tok, tgt))
            engine.step()
        engine.save_checkpoint(ckpt)
        return
    before = _status(os.getpid(), "RssAnon")
    peak = PeakAnon(os.getpid())
    engine.load_checkpoint(ckpt)
    grown = peak.stop() - before
    out = torch.tensor([float(grown)])
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, out)
    if rank == 0:
        print("LOAD " + json.dumps({"anon_growth_bytes_per_rank": [int(t.item()) for t in gathered],
                                    "params": sum(p.numel() for p in model.parameters())}),
              flush=True)


def _launch(nproc: int, mode: str, ckpt: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(CONFIG, f)
    p = subprocess.run([DSLAUNCH, "run", "--nproc-per-node", str(nproc), "--config", f.name,
                        __file__, "--rank", mode, ckpt], capture_output=True, text=True,
                       cwd=ROOT, env=ENV, timeout=1800)
    os.unlink(f.name)
    if p.returncode != 0:
        raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
    return p.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rank", nargs=2, metavar=("MODE", "CKPT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        return rank_main(*a.rank)

    import benchutil as bu

    load_start = bu.loadavg()
    work = Path(tempfile.mkdtemp(prefix="bench_reshape_"))
    ck = work / "ck2"
    _launch(2, "save", str(ck))
    tag = (ck / "latest").read_text().strip()
    ckpt_bytes = sum(f.stat().st_size for f in (ck / tag).iterdir())
    imports = ("import torch, dslaunch.cli, dslaunch.engine.checkpoint.reshape as r, "
               "dslaunch.engine.checkpoint.consolidate as c")
    base = _measure(_py(imports))
    reshape = _measure(_py(imports + f"\nr.reshape({str(ck)!r}, {str(work / 'ck4')!r}, 4)"))
    to_fp32 = _measure(_py(imports + f"\nc.to_fp32({str(ck)!r}, {str(work / 'fp32.pt')!r})"))
    out = _launch(4, "load", str(ck))  # lines carry the launcher's [host:rank] prefix
    load = json.loads(next(ln for ln in out.splitlines() if "LOAD {" in ln).split("LOAD ", 1)[1])
    psi = load["params"]
    model_fp32 = 4 * psi

    def rel(m):
        anon = m["peak_anon_bytes"] - base["peak_anon_bytes"]
        return {"anon_bytes": anon, "anon_x_model_fp32": round(anon / model_fp32, 3),
                "anon_x_checkpoint": round(anon / ckpt_bytes, 3),
                "rss_bytes": m["peak_rss_bytes"] - base["peak_rss_bytes"]}

    growth = load["anon_growth_bytes_per_rank"]
    result = {
        "bench": "ckpt_reshape", "when": bu.now_iso(), "machine": bu.machine(), "git": bu.git_rev(),
        "loadavg_start": load_start, "loadavg_end": bu.loadavg(),
        "malloc_mmap_threshold": int(ENV["MALLOC_MMAP_THRESHOLD_"]),
        "model": "examples/gpt.py bench_config() fp32, AdamW, ZeRO stage 3 saved on 2 ranks",
        "params": psi, "model_fp32_bytes": model_fp32, "checkpoint_bytes": ckpt_bytes,
        "import_baseline": base,
        "ckpt_reshape_2_to_4": rel(reshape), "ckpt_to_fp32": rel(to_fp32),
        "load_checkpoint_2_to_4_ranks": {
            "anon_growth_bytes_per_rank": growth,
            "max_x_model_fp32": round(max(growth) / model_fp32, 3)},
    }
    shutil.rmtree(work, ignore_errors=True)  # checkpoints of the 27M model: ~1 GB
    path = bu.save_json(result, "ckpt_reshape", Path(a.out_dir) if a.out_dir else None)
    print(json.dumps(result, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
