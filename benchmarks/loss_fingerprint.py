"""Loss fingerprint: the exact losses of a fixed set of small training jobs, for refactors.

A refactor that should change no arithmetic (moving code, typed config, dispatch tables) must
give bit-identical losses. Record before, change, record after, compare:

    .venv/bin/python benchmarks/loss_fingerprint.py --out before.json
    ... change the code ...
    .venv/bin/python benchmarks/loss_fingerprint.py --out after.json --compare before.json

Each job is a real ``dslaunch run`` (gloo, OMP_NUM_THREADS=1) of one of the tests' rank scripts:
ZeRO 0-3 in fp32/bf16/fp16, CPU offload, NVMe offload (optimizer and parameters), 4 ranks,
pipeline and pipeline x tensor parallel, the 1-bit optimizers, and the example. Losses are
written with ``repr`` precision; ``--compare`` lists every job whose losses differ in any bit.
``--only a,b`` runs a subset. Takes about 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
DSLAUNCH = Path(sys.executable).with_name("dslaunch")

ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}


def _zero(stage, precision="fp32", offload=False, offload_param=False, bucket=20000):
    c = {"train_batch_size": 16, "gradient_accumulation_steps": 2, "optimizer": ADAMW,
         "gradient_clipping": 0.5, "steps_per_print": 1000,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket}}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    if precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 32, "loss_scale_window": 5}
    if offload:
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if offload_param:
        c["zero_optimization"]["offload_param"] = {"device": "cpu"}
    if stage == 3:
        c["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return c


def _nvme(stage, param=False):
    zero = {"stage": stage, "reduce_bucket_size": 8000, "sub_group_size": 3000,
            "offload_optimizer": {"device": "nvme", "nvme_path": "{tmp}/nvme", "buffer_count": 4}}
    if param:
        zero.update(offload_param={"device": "nvme", "nvme_path": "{tmp}/nvme", "max_in_cpu": 0,
                                   "buffer_count": 3},
                    stage3_param_persistence_threshold=100, stage3_prefetch_bucket_size=3000)
    return {"train_batch_size": 8, "gradient_accumulation_steps": 2, "optimizer": ADAMW,
            "gradient_clipping": 0.5, "steps_per_print": 1000,
            "aio": {"block_size": 65536, "queue_depth": 4, "thread_count": 2},
            "zero_optimization": zero}


def _pipe(micro, gas, zero_stage=0):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
            "gradient_clipping": 1.0, "zero_optimization": {"stage": zero_stage}}


def _onebit(kind):
    params = {"lr": 2e-3, "freeze_step": 8} if kind in ("OneBitAdam", "OneBitLamb") else {"lr": 2e-3}
    if kind == "ZeroOneAdam":
        params.update(var_freeze_step=8, var_update_scaler=4, local_step_scaler=8,
                      local_step_clipper=2)
    return {"train_batch_size": 8, "optimizer": {"type": kind, "params": params},
            "steps_per_print": 1000}


# name: (script, ranks, config, args); "{out}" and "{tmp}" are filled in per job
JOBS = {
    "zero_s0": ("zero_train.py", 2, _zero(0), ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s1": ("zero_train.py", 2, _zero(1), ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s2": ("zero_train.py", 2, _zero(2), ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s3": ("zero_train.py", 2, _zero(3), ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s2_off": ("zero_train.py", 2, _zero(2, offload=True),
                    ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s3_off": ("zero_train.py", 2, _zero(3, offload=True, offload_param=True),
                    ["--steps", "12", "--out", "{out}/r.json"]),
    "zero_s2_4ranks": ("zero_train.py", 4, _zero(2, bucket=3000),
                       ["--steps", "8", "--out", "{out}/r.json"]),
    "zero_b2": ("zero_train.py", 2, _zero(2, "bf16"), ["--steps", "8", "--out", "{out}/r.json"]),
    "zero_b3": ("zero_train.py", 2, _zero(3, "bf16"), ["--steps", "8", "--out", "{out}/r.json"]),
    "zero_h2": ("zero_train.py", 2, _zero(2, "fp16"), ["--steps", "12", "--out", "{out}/r.json"]),
    "nvme_s2": ("nvme_train.py", 2, _nvme(2), ["--out", "{out}/r.json"]),
    "nvme_s3_param": ("nvme_train.py", 2, _nvme(3, param=True), ["--out", "{out}/r.json"]),
    "pipe_2": ("pipe_train.py", 2, _pipe(2, 4), ["--out", "{out}", "--pp", "2", "--steps", "3"]),
    "pipe_2_zero1_tied": ("pipe_train.py", 4, _pipe(2, 2, 1),
                          ["--out", "{out}", "--pp", "2", "--steps", "3", "--tied"]),
    "pipe_2x_tp2": ("pipe_train.py", 4, _pipe(2, 2),
                    ["--out", "{out}", "--pp", "2", "--tp", "2", "--vocab-parallel", "--steps", "3"]),
    "onebit_adam": ("onebit_train.py", 2, _onebit("OneBitAdam"),
                    ["--out", "{out}", "--steps", "16"]),
    "zero_one_adam": ("onebit_train.py", 2, _onebit("ZeroOneAdam"),
                      ["--out", "{out}", "--steps", "16"]),
    "onebit_lamb": ("onebit_train.py", 2, _onebit("OneBitLamb"),
                    ["--out", "{out}", "--steps", "16"]),
    "example": (str(ROOT / "examples" / "train_gpt.py"), 2, "configs/gpt_small.json",
                ["--steps", "6", "--log-every", "1", "--d-model", "64", "--data-bytes", "200000"]),
}


def _fill(value, out, tmp):
    if isinstance(value, str):
        return value.replace("{out}", str(out)).replace("{tmp}", str(tmp))
    if isinstance(value, dict):
        return {k: _fill(v, out, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, out, tmp) for v in value]
    return value


def run_job(name: str, tmp: Path) -> dict:
    script, nproc, config, args = JOBS[name]
    out = tmp / name
    out.mkdir(parents=True)
    (tmp / "nvme").mkdir(exist_ok=True)
    if isinstance(config, dict):
        cfg_path = tmp / f"{name}.json"
        cfg_path.write_text(json.dumps(_fill(config, out, tmp)))
    else:
        cfg_path = ROOT / config
    script_path = Path(script) if os.path.isabs(script) else SCRIPTS / script
    cmd = [str(DSLAUNCH), "run", "--nproc-per-node", str(nproc), "--omp-threads", "1",
           "--config", str(cfg_path), str(script_path), *_fill(args, out, tmp)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    return {"losses": _losses(out, proc.stdout)}


def _losses(out: Path, stdout: str):
    """Every rank file's losses (rank scripts), or the example's printed losses."""
    files = sorted(out.glob("*.json"))
    if files:
        found = {}
        for f in files:
            rec = json.loads(f.read_text())
            if "losses" in rec:
                found[f.name] = rec["losses"]
        return found
    return re.findall(r"loss ([0-9.]+)", stdout)


def compare(now: dict, before: dict) -> list:
    lines = []
    for name in sorted(set(now) | set(before)):
        a, b = before.get(name), now.get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in {'the new run' if a is None else 'the old run'}")
        elif a != b:
            lines.append(f"{name}: DIFFERS\n  before {json.dumps(a)[:400]}\n  now    {json.dumps(b)[:400]}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--compare", default=None, help="an earlier --out file: list what differs")
    p.add_argument("--only", default="", help="comma list of job names")
    a = p.parse_args()
    names = [n for n in a.only.split(",") if n] or list(JOBS)
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        p.error(f"unknown job(s) {unknown}; known: {', '.join(JOBS)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="loss_fp_") as tmp:
        for name in names:
            results[name] = run_job(name, Path(tmp))
            state = "error" if "error" in results[name] else "ok"
            print(f"{name}: {state}", flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    failed = [n for n, r in results.items() if "error" in r]
    for n in failed:
        print(f"--- {n} failed:\n{results[n]['error']}")
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        before = {k: v for k, v in before.items() if k in results}
        diffs = compare(results, before)
        print("\n".join(diffs) if diffs else f"all {len(results)} jobs bit-identical to {a.compare}")
        return 1 if diffs or failed else 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
