#!/usr/bin/env python
"""ZeRO-Inference, dslaunch vs DeepSpeed, on the same recipe and the same script.

The script is examples/zero_inference.py (unmodified DeepSpeed API): a Transformers causal LM
built from a config (Llama by default; no random init: ``no_init_weights``, built in bf16, every
weight filled from one seeded random block tiled over it, so a multi-billion-parameter model
builds in seconds), ZeRO-3 with ``offload_param: {device: cpu, pin_memory: true}``
(configs/zero_inference.json), ``deepspeed.initialize(model=, config=)`` without an optimizer,
then ``engine.module(input_ids)`` (prefill of batch x prompt-len, no cache, one warm-up pass then
``--prefill-iters`` timed) and ``engine.module.generate()`` of ``--new-tokens`` greedy tokens.
One rank, started two ways:

  dslaunch   dslaunch run --as-deepspeed --nproc-per-node 1 examples/zero_inference.py ...
  deepspeed  PEER_PYTHON examples/zero_inference.py ...   (RANK/WORLD_SIZE/MASTER_* set here;
             PYTHONPATH=--peer-pythonpath; DS_ACCELERATOR=cpu where there is no CUDA)

    .venv/bin/python benchmarks/bench_zero_inference.py --smoke \\
        --peer-python benchmarks/.peer-venv/bin/python            # tiny model, CPU, both
    python benchmarks/bench_zero_inference.py --hidden 4096 --layers 32 --heads 32 \\
        --batch 4 --prompt-len 512 --new-tokens 8 --gpu-cap-gb 8 --peer-python ...   # ~6.7B, GPU

``--gpu-cap-gb``: after ``initialize`` each run caps its device memory
(``torch.cuda.set_per_process_memory_fraction``) below the model's bf16 weights: the run only
works if the weights stream. Runs are interleaved (``--repeats`` rounds, dslaunch and DeepSpeed
adjacent), each under ``--timeout`` seconds (its process group killed past it), logged as it goes
(one line per run, its output under the results directory), and the JSON (every run, then the
medians and dslaunch / DeepSpeed ratios of prefill and generate tokens/s and peak memory) is
rewritten after every run to ``--results-dir/zero_inference-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))

import benchutil as bu

EXAMPLE = bu.REPO / "examples" / "zero_inference.py"
CONFIG = bu.REPO / "configs" / "zero_inference.json"
MODEL_ARGS = ("arch", "hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "batch",
              "prompt_len", "new_tokens", "prefill_iters", "dtype", "gpu_cap_gb")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--runtimes", default="dslaunch,deepspeed")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds")
    p.add_argument("--arch", default="llama", choices=("llama", "gpt2"))
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--intermediate", type=int, default=None)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--prefill-iters", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--gpu-cap-gb", type=float, default=None)
    p.add_argument("--config", default=str(CONFIG), help="the DeepSpeed config both runs use")
    p.add_argument("--prefetch-bucket-size", type=float, default=None,
                   help="override zero_optimization.stage3_prefetch_bucket_size (elements)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny Llama (hidden 64, 2 layers, vocab 512), fp32, prompt 8, 4 tokens")
    p.add_argument("--check", action="store_true", help="each run also compares its tokens with "
                   "generate() on the unsharded model (small models only)")
    p.add_argument("--omp-threads", default=None, help="OMP_NUM_THREADS for both (default: unset)")
    p.add_argument("--peer-python", default=None,
                   help="a python with deepspeed + transformers (default: benchmarks/peers.py's)")
    p.add_argument("--peer-pythonpath", default=None, help="PYTHONPATH for the DeepSpeed runs")
    p.add_argument("--ds-accelerator", default=None,
                   help="DS_ACCELERATOR for the DeepSpeed runs (default: cpu without CUDA)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.heads, args.vocab = 64, 2, 4, 512
        args.batch, args.prompt_len, args.new_tokens, args.dtype = 2, 8, 4, "fp32"
        args.kv_heads = args.intermediate = None
    args.runtime_list = bu.split(args.runtimes)
    for rt in args.runtime_list:
        if rt not in ("dslaunch", "deepspeed"):
            p.error(f"--runtimes: {rt!r} is not dslaunch or deepspeed")
    return args


def _log(msg: str) -> None:
    bu.log(time.strftime("%H:%M:%S ") + msg)


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def script_args(args, cfg_path: Path, out: Path) -> list:
    argv = [str(EXAMPLE), "--config", str(cfg_path), "--out", str(out)]
    for name in MODEL_ARGS:
        v = getattr(args, name)
        if v is not None:
            argv += ["--" + name.replace("_", "-"), str(v)]
    if args.check:
        argv.append("--check")
    return argv


def command(rt, args, cfg_path, out, peer_py) -> list:
    if rt == "dslaunch":
        launcher = bu.venv_bin("dslaunch")
        pre = [launcher] if launcher else [sys.executable, "-m", "dslaunch"]
        extra = ["--omp-threads", str(args.omp_threads)] if args.omp_threads else []
        return pre + ["run", "--as-deepspeed", "--nproc-per-node", "1", *extra] + \
            script_args(args, cfg_path, out)
    return [peer_py] + script_args(args, cfg_path, out)


def run_env(rt, args) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.omp_threads:
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "DSLAUNCH_AS_DEEPSPEED"):
        env.pop(k, None)
    if rt == "dslaunch":
        env["PYTHONPATH"] = os.pathsep.join([str(bu.REPO)] + [x for x in [env.get("PYTHONPATH")]
                                                              if x])
    else:
        env.pop("PYTHONPATH", None)
        if args.peer_pythonpath:
            env["PYTHONPATH"] = args.peer_pythonpath
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bu.free_port()))
        acc = args.ds_accelerator or (None if cuda_available() else "cpu")
        if acc:
            env["DS_ACCELERATOR"] = acc
    return env


def one_run(rt, args, work: Path, rep: int, cfg_path: Path, peer_py) -> dict:
    out_dir = work / f"{rt}_r{rep}"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "result.json"
    cmd = command(rt, args, cfg_path, out, peer_py)
    log_path = out_dir / "run.log"
    rc, wall = bu.run_logged(cmd, log_path, run_env(rt, args), args.timeout)
    run = {"runtime": rt, "repeat": rep, "command": shlex.join(cmd), "returncode": rc,
           "wall_seconds": round(wall, 2), "log": str(log_path)}
    if (rc != 0 and rc != 3) or not out.exists():  # 3: tokens differ (--check), numbers kept
        tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        run.update(status="timeout" if rc == "timeout" else "failed", log_tail=tail)
        return run
    r = json.loads(out.read_text())
    r.pop("tokens", None)
    r.pop("reference_tokens", None)
    want = "dslaunch" if rt == "dslaunch" else "deepspeed"
    if r.get("runtime") != want:
        run.update(status="wrong runtime", result=r)
    else:
        run.update(status="ok" if rc == 0 else "tokens differ", result=r)
    return run


def summarize(runs, runtimes) -> dict:
    out = {}
    for rt in runtimes:
        ok = [r["result"] for r in runs
              if r["runtime"] == rt and r["status"] in ("ok", "tokens differ")]
        if not ok:
            continue
        out[rt] = {k: bu.median([r[k] for r in ok if r.get(k) is not None])
                   if any(r.get(k) is not None for r in ok) else None
                   for k in ("prefill_tokens_per_s", "generate_tokens_per_s", "peak_gpu_bytes",
                             "init_s", "build_s")}
        out[rt]["runs"] = len(ok)
    if "dslaunch" in out and "deepspeed" in out:
        ratios = {}
        for k in ("prefill_tokens_per_s", "generate_tokens_per_s", "peak_gpu_bytes"):
            a, b = out["dslaunch"][k], out["deepspeed"][k]
            ratios[k] = round(a / b, 3) if a and b else None
        out["dslaunch_over_deepspeed"] = ratios
    return out


def main(argv=None):
    args = parse_args(argv)
    peer_py = None
    if "deepspeed" in args.runtime_list:
        peer_py = args.peer_python or bu.peer_python(create=False)
        if not peer_py:
            sys.exit("no DeepSpeed python: pass --peer-python (or --runtimes dslaunch)")
    stamp = bu.timestamp()
    results_dir = Path(args.results_dir)
    work = results_dir / f"zero_inference-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(Path(args.config).read_text())
    if args.prefetch_bucket_size:
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = args.prefetch_bucket_size
    if args.smoke:  # tiny weights: partition every one (none persistent)
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 10
    cfg_path = work / "ds_config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    doc = {"kind": "zero_inference", "started": bu.now_iso(), "machine": bu.machine(),
           "git": bu.git_rev(), "args": {k: v for k, v in vars(args).items()
                                        if k != "runtime_list"},
           "config": cfg, "runs": [], "summary": {}}
    path = results_dir / f"zero_inference-{stamp}.json"

    def save():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    save()
    _log(f"zero_inference: {len(args.runtime_list)} runtimes x {args.repeats} rounds, "
           f"results {path}")
    for rep in range(args.repeats):
        for rt in args.runtime_list:
            t0 = time.time()
            _log(f"run {rt} round {rep}: starting (timeout {args.timeout:.0f} s)")
            run = one_run(rt, args, work, rep, cfg_path, peer_py)
            doc["runs"].append(run)
            doc["summary"] = summarize(doc["runs"], args.runtime_list)
            save()
            r = run.get("result", {})
            if "result" in run:
                peak = r.get("peak_gpu_bytes")
                _log(f"run {rt} round {rep}: {run['status']} in {time.time() - t0:.1f} s: "
                       f"{r['params'] / 1e9:.2f}B params ({r['model_bytes'] / 2**30:.1f} GiB), "
                       f"prefill {r['prefill_tokens_per_s']:.1f} tok/s, generate "
                       f"{r['generate_tokens_per_s']:.2f} tok/s, peak GPU "
                       f"{(peak or 0) / 2**30:.2f} GiB, init {r['init_s']:.1f} s"
                       + (f", match {r['match']}" if "match" in r else ""))
            else:
                _log(f"run {rt} round {rep}: {run['status']} (rc {run['returncode']}) after "
                       f"{time.time() - t0:.1f} s; log {run['log']}\n"
                       + run.get("log_tail", "")[-800:])
    doc["finished"] = bu.now_iso()
    save()
    print(json.dumps(doc["summary"], indent=1))
    return 0 if all(r["status"] == "ok" for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
