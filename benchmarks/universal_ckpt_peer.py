"""dslaunch's universal checkpoint loads into DeepSpeed and continues with dslaunch's losses (a
one-off check outside CI: it needs the DeepSpeed venv, benchmarks/peers.py).

    .venv/bin/python benchmarks/universal_ckpt_peer.py [--out-dir benchmarks/results]

1. dslaunch, 2 ranks, ZeRO 2 (gloo, CPU): the tiny GPT of tests/fixtures/universal_ckpt trained
   3 steps on the fixture's batches, ``save_checkpoint``, 3 more steps (their losses);
2. ``dslaunch ckpt to-universal`` of that checkpoint;
3. DeepSpeed 0.19.8 (``checkpoint.load_universal``, fresh weights from another seed) loads it
   (``RUNS``: ZeRO 2 at world size 1 and 2, ZeRO 1 and 3 at 2;
   tests/fixtures/universal_ckpt/make_fixture.py ``resume``) and trains the same 3 global
   batches.

Prints (and writes ``universal_ckpt_peer-<time>.json``) both loss lists and the largest
relative difference.

``--autotp``: the same with AutoTP: dslaunch at TP 2 (2 ranks, ZeRO 1) trains the tiny Llama of
tests/fixtures/autotp_universal 3 steps and saves (tests/scripts/autotp_reshape.py), ``dslaunch
ckpt to-universal`` merges its TP slices, and DeepSpeed 0.19.8's AutoTP loads the folder at TP 2
and at TP 1 (that fixture's make_fixture.py ``resume``) and trains the next 3 batches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import peer_python  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "universal_ckpt"
RUNS = [(1, 2), (2, 2), (2, 1), (2, 3)]  # DeepSpeed's (world size, ZeRO stage) loading it


def _run(cmd, **kw) -> None:
    proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--autotp", action="store_true", help="a TP 2 (AutoTP) checkpoint instead")
    args = ap.parse_args()
    py = peer_python(create=False)
    if py is None:
        sys.exit("the DeepSpeed venv is not ready: python benchmarks/peers.py")
    if args.autotp:
        return _autotp(py, args.out_dir)
    fix = json.loads((FIXTURE / "fixture.json").read_text())
    cfg = dict(fix["config"], train_micro_batch_size_per_gpu=2)
    cfg["optimizer"] = {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.0}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "ds.json").write_text(json.dumps(cfg))
        dslaunch = [sys.executable, "-m", "dslaunch"]
        _run(dslaunch + ["run", "--nproc-per-node", "2", "--omp-threads", "1", "--config",
                         tmp / "ds.json", "tests/scripts/universal_train.py", "--fixture",
                         FIXTURE / "fixture.json", "--save", tmp / "ckpt", "--out", tmp / "out"])
        ours = json.loads((tmp / "out" / "rank_0.json").read_text())["losses"]
        _run(dslaunch + ["ckpt", "to-universal", tmp / "ckpt", tmp / "uni"])
        theirs = {}
        for n, stage in RUNS:
            out = tmp / f"ds_{n}_{stage}.json"
            _run([py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                  FIXTURE / "make_fixture.py", "resume", "--ckpt", tmp / "uni", "--stage", stage,
                  "--out", out])
            theirs[f"world {n}, ZeRO {stage}"] = json.loads(out.read_text())
    rel = max(abs(a - b) / abs(b) for losses in theirs.values() for a, b in zip(losses, ours))
    result = {"what": "dslaunch ZeRO-2 (2 ranks) checkpoint -> dslaunch ckpt to-universal -> "
                      "DeepSpeed 0.19.8 load_universal",
              "dslaunch_losses_after_save": ours, "deepspeed_losses_after_load": theirs,
              "max_rel_diff": rel}
    print(json.dumps(result, indent=1))
    os.makedirs(args.out_dir, exist_ok=True)
    out = Path(args.out_dir) / f"universal_ckpt_peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    return 0


def _report(result: dict, out_dir: str) -> int:
    print(json.dumps(result, indent=1))
    os.makedirs(out_dir, exist_ok=True)
    out = Path(out_dir) / f"universal_ckpt_peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    return 0


def _autotp(py: str, out_dir: str) -> int:
    fixture = ROOT / "tests" / "fixtures" / "autotp_universal"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dslaunch = [sys.executable, "-m", "dslaunch"]
        _run(dslaunch + ["run", "--nproc-per-node", "2", "--omp-threads", "1",
                         "tests/scripts/autotp_reshape.py", "--tp", "2", "--stages", "1",
                         "--save", tmp / "ckpt", "--out", tmp / "out"])
        ours = json.loads((tmp / "out" / "rank_0.json").read_text())["z1"]["losses"]
        _run(dslaunch + ["ckpt", "to-universal", tmp / "ckpt", tmp / "uni", "--tag", "z1"])
        theirs = {}
        for tp in (2, 1):
            out = tmp / f"ds_tp{tp}.json"
            _run([py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={tp}",
                  fixture / "make_fixture.py", "resume", "--ckpt", tmp / "uni", "--tp", tp,
                  "--out", out])
            theirs[f"TP {tp}, ZeRO 1"] = json.loads(out.read_text())
    rel = max(abs(a - b) / abs(b) for losses in theirs.values() for a, b in zip(losses, ours))
    return _report({"what": "dslaunch AutoTP TP 2 ZeRO 1 checkpoint -> dslaunch ckpt "
                            "to-universal -> DeepSpeed 0.19.8 AutoTP load_universal",
                    "dslaunch_losses_after_save": ours, "deepspeed_losses_after_load": theirs,
                    "max_rel_diff": rel}, out_dir)


if __name__ == "__main__":
    sys.exit(main())
