"""GPT-2 at sizes people train (355M, 1.3B) on one GPU: dslaunch vs DeepSpeed, per ZeRO config (issue 31
part 5). The same unmodified DeepSpeed-style script trains on both engines:

  dslaunch   DSLAUNCH_PYTHON -m dslaunch run --nproc-per-node 1 --as-deepspeed SCRIPT ...
  deepspeed  PEER_PYTHON -m torch.distributed.run --standalone --nproc_per_node 1 SCRIPT ...
             (PYTHONPATH = --peer-pythonpath, where DeepSpeed is installed)

SCRIPT: ``peer_scripts/gpt2_ds_train.py`` (--script ds: deepspeed.initialize / backward / step) or
``peer_scripts/hf_gpt2_trainer.py`` (--script hf: the HF Trainer with ``deepspeed=CONFIG``).

Configs (bf16, AdamW lr 1e-4, gradient_clipping 1.0, written here, the same file for both engines):
z0, z1, z2, z3, z2off (offload_optimizer cpu, pin_memory), z3off (offload_param + offload_optimizer
cpu, pin_memory), z3nvme (both on NVMe under --nvme-path).

Rounds are interleaved: round r runs every config on both runtimes, the runtime that goes first
alternating per round. Per run: median timed step (steps after --warmup), tokens/s = micro_batch *
seq * world / median step, peak GPU memory (torch.cuda.max_memory_allocated over the training steps),
losses. Model FLOPs per step (no activation recomputation counted, causal mask not discounted):

    FLOPs/step = 6 * N * T  +  12 * L * d * s * T,    T = micro_batch * seq * world tokens

N = all parameters (tied embedding counted once), L layers, d hidden size, s sequence length; the
second term is attention's QK^T and AV matmuls (2 * 2 * s * d per token per layer forward, x3 for
forward + backward). TFLOPS = FLOPs/step / median step / 1e12 (per GPU: world is 1 here).

Per config: medians over rounds, ratios dslaunch / deepspeed (tokens/s > 1: dslaunch faster; peak
memory < 1: dslaunch smaller), and the loss curves' largest relative difference (same round).
The JSON (``<results-dir>/gpu_train-<script>-<timestamp>.json``) is rewritten after every run, so a
killed benchmark still leaves what finished; a one-line summary per run is printed as it ends. Run
logs (head + tail) are under ``<results-dir>/logs``. ``--budget``: no run starts after it is spent
(or when the same config's last run would not fit); skipped runs are recorded. ``--prebuild``:
DeepSpeed's CPUAdam / FusedAdam and dslaunch's cpu_adam (and CUDA ops) are built first, in parallel,
so that no timed run includes a JIT build. The harness imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer_scripts"))
import benchutil as bu

SCRIPTS = {"ds": bu.PEER_SCRIPTS / "gpt2_ds_train.py", "hf": bu.PEER_SCRIPTS / "hf_gpt2_trainer.py"}
CONFIGS = ("z0", "z1", "z2", "z3", "z2off", "z3off", "z3nvme")
RUNTIMES = ("dslaunch", "deepspeed")
ENGINE_MODULE = {"dslaunch": "dslaunch", "deepspeed": "deepspeed"}
SIZES = {  # name: (n_layer, n_embd) -- the FLOPs formula needs them before a run reports
    "tiny": (2, 64), "small": (4, 256), "125m": (12, 768), "355m": (24, 1024), "760m": (36, 1280),
    "1.3b": (24, 2048), "1.5b": (48, 1600),
}
LOG_HEAD, LOG_TAIL = 8_000, 24_000


def ds_config(name: str, args) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if args.precision == "fp32":
        del cfg["bf16"]
    stage = {"z0": 0, "z1": 1, "z2": 2, "z3": 3, "z2off": 2, "z3off": 3, "z3nvme": 3}[name]
    zero = {"stage": stage}
    if stage >= 2:
        zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=5e8)
    if stage == 2:
        zero["allgather_bucket_size"] = 5e8
    if name == "z2off":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    elif name == "z3off":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif name == "z3nvme":
        nvme = str(Path(args.nvme_path).resolve())
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme, "pin_memory": True}
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme, "pin_memory": True}
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                      "overlap_events": True, "thread_count": 1}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=5e7, stage3_param_persistence_threshold=1e5,
                    stage3_max_live_parameters=1e9, stage3_max_reuse_distance=1e9)
    cfg["zero_optimization"] = zero
    return cfg


def flops_per_step(size: str, params: int | None, tokens: int, seq: int) -> float | None:
    if not params:
        return None
    n_layer, d = SIZES[size]
    return 6.0 * params * tokens + 12.0 * n_layer * d * seq * tokens


# ------------------------------------------------------------------------------------- commands


def command(rt: str, args, cfg_path: Path, out_dir: Path) -> list:
    script = [str(SCRIPTS[args.script]), "--ds-config", str(cfg_path), "--size", args.size,
              "--micro-batch", str(args.micro_batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    if args.script == "hf":
        script += ["--out", str(out_dir)]
    if rt == "dslaunch":
        return [args.dslaunch_python, "-m", "dslaunch", "run", "--nproc-per-node", "1", "--as-deepspeed"] + script
    return [args.peer_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"] + script


def base_env(args) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.omp_threads)
    env["PYTHONUNBUFFERED"] = "1"
    env["BENCH_DEVICE"] = args.device
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    if args.cuda_arch:
        env["TORCH_CUDA_ARCH_LIST"] = args.cuda_arch
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK", "DSLAUNCH_AS_DEEPSPEED", "DS_ACCELERATOR", "DSLAUNCH_ACCELERATOR"):
        env.pop(k, None)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_env(rt: str, args) -> dict:
    env = base_env(args)
    peer_paths = [x for x in bu.split(args.peer_pythonpath.replace(os.pathsep, ","))] if args.peer_pythonpath else []
    inherited = [x for x in (env.get("PYTHONPATH") or "").split(os.pathsep) if x]
    if rt == "dslaunch":  # this checkout's dslaunch; never the real DeepSpeed's directory
        keep = [x for x in inherited if x not in peer_paths]
        env["PYTHONPATH"] = os.pathsep.join([str(bu.REPO)] + keep)
        env["DSLAUNCH_ACCELERATOR"] = args.device
    else:  # the peer's own packages (and the inherited path minus this checkout)
        keep = [x for x in inherited if Path(x).resolve() != bu.REPO.resolve()]
        paths = peer_paths + [x for x in keep if x not in peer_paths]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            env.pop("PYTHONPATH", None)
        if args.device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"
    return env


# ------------------------------------------------------------------------------------- one run


def parse_log(text: str) -> tuple[list, dict | None]:
    steps, final = [], None
    for line in text.splitlines():
        i = line.find("BENCH_JSON ")
        if i < 0:
            continue
        try:
            obj = json.loads(line[i + len("BENCH_JSON "):])
        except ValueError:
            continue
        if obj.get("final"):
            final = obj
        elif "step" in obj:
            steps.append(obj)
    return steps, final


def trim_log(path: Path) -> str:
    data = path.read_bytes()
    if len(data) > LOG_HEAD + LOG_TAIL:
        data = data[:LOG_HEAD] + b"\n[... %d bytes cut ...]\n" % (len(data) - LOG_HEAD - LOG_TAIL) + data[-LOG_TAIL:]
        path.write_bytes(data)
    return data.decode(errors="replace")


def one_run(rt: str, cfg_name: str, rnd: int, args, timeout: float) -> dict:
    tag = f"{args.script}_{cfg_name}_{rt}_r{rnd}"
    out_dir = args.work / tag
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / "ds_config.json"
    cfg_path.write_text(json.dumps(ds_config(cfg_name, args), indent=1))
    if cfg_name == "z3nvme":
        Path(args.nvme_path).mkdir(parents=True, exist_ok=True)
    cmd = command(rt, args, cfg_path, out_dir)
    log_path = args.logs / f"{tag}.log"
    started = time.time()
    rc, wall = bu.run_logged(cmd, log_path, run_env(rt, args), timeout)
    text = trim_log(log_path)
    steps, final = parse_log(text)
    run = {"runtime": rt, "config": cfg_name, "round": rnd, "script": args.script, "returncode": rc,
           "wall_seconds": round(wall, 2), "started": started, "command": shlex.join(cmd),
           "log": str(log_path)}
    timed = [s["step_s"] for s in steps if not s.get("warmup")]
    run["losses"] = [s["loss"] for s in steps]
    run["step_seconds"] = [s["step_s"] for s in steps]
    med = bu.median(timed)
    tokens = args.micro_batch * args.seq * ((final or {}).get("world_size") or 1)
    run["tokens_per_step"] = tokens
    run["median_step_s"] = med
    run["tokens_per_s"] = round(tokens / med, 1) if med else None
    params = (final or {}).get("params")
    fl = flops_per_step(args.size, params, tokens, args.seq)
    run["tflops"] = round(fl / med / 1e12, 4) if fl and med else None
    run["params"] = params
    if final:
        for k in ("peak_gpu_bytes", "peak_gpu_init_bytes", "peak_gpu_reserved_bytes", "init_s",
                  "engine_module", "engine_class", "optimizer", "deepspeed_version", "attn_implementation",
                  "trainer_train_runtime", "hf_logged_losses"):
            if k in final:
                run[k] = final[k]
    gb = run.get("peak_gpu_bytes")
    run["peak_gpu_gib"] = round(gb / 2**30, 2) if gb else None
    if rc == "timeout":
        run["status"] = "timeout"
    elif rc != 0 or final is None:
        run["status"] = "failed"
        run["log_tail"] = text[-2000:]
    elif not str(final.get("engine_module", "")).startswith(ENGINE_MODULE[rt]):
        run["status"] = "wrong engine"
    else:
        run["status"] = "ok"
    return run


# ------------------------------------------------------------------------------------- summary


def rel_diff(a: list, b: list):
    n = min(len(a), len(b))
    if not n:
        return None
    return round(max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n])), 6)


def summarize(runs: list, configs: list) -> dict:
    out = {}
    for c in configs:
        row = {}
        for rt in RUNTIMES:
            ok = [r for r in runs if r["config"] == c and r["runtime"] == rt and r["status"] == "ok"]
            row[rt] = {"runs_ok": len(ok),
                       "runs_other": sorted({r["status"] for r in runs if r["config"] == c and r["runtime"] == rt
                                             and r["status"] != "ok"}),
                       "tokens_per_s_median": bu.median([r["tokens_per_s"] for r in ok]),
                       "tflops_median": bu.median([r["tflops"] for r in ok]),
                       "median_step_s_median": bu.median([r["median_step_s"] for r in ok]),
                       "peak_gpu_gib_median": bu.median([r["peak_gpu_gib"] for r in ok]),
                       "step_s_per_round": [r["median_step_s"] for r in ok]}
        a, b = row["dslaunch"], row["deepspeed"]
        row["ratio_dslaunch_over_deepspeed"] = {
            "tokens_per_s": bu.ratio(a["tokens_per_s_median"], b["tokens_per_s_median"]),
            "peak_gpu_mem": bu.ratio(a["peak_gpu_gib_median"], b["peak_gpu_gib_median"]),
        }
        diffs = []
        for rnd in sorted({r["round"] for r in runs}):
            pair = [next((r for r in runs if r["config"] == c and r["runtime"] == rt and r["round"] == rnd
                          and r["losses"]), None) for rt in RUNTIMES]
            if all(pair):
                diffs.append(rel_diff(pair[0]["losses"], pair[1]["losses"]))
        row["loss_max_rel_diff"] = max((d for d in diffs if d is not None), default=None)
        out[c] = row
    return out


def gib(x):
    return f"{x:.2f}" if isinstance(x, (int, float)) else "-"


def line(run: dict) -> str:
    return (f"[bench] {run['script']} {run['config']:<7} {run['runtime']:<9} r{run['round']} {run['status']:<8} "
            f"step {run['median_step_s'] or 0:.4f}s  tok/s {run['tokens_per_s'] or 0:>9.1f}  "
            f"TFLOPS {run['tflops'] or 0:>6.2f}  peak {gib(run.get('peak_gpu_gib'))} GiB  "
            f"loss {(run['losses'] or [None])[-1]}  wall {run['wall_seconds']:.0f}s")


# ------------------------------------------------------------------------------------- facts, prebuild


def facts(args) -> dict:
    code = ("import json, sys, torch\nd = {'python': sys.version.split()[0], 'torch': torch.__version__, "
            "'torch_cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}\n"
            "if torch.cuda.is_available():\n"
            "    d['device_name'] = torch.cuda.get_device_name(); d['capability'] = '%d.%d' % "
            "torch.cuda.get_device_capability()\n"
            "    d['gpu_total_gib'] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)\n"
            "for m in ('transformers', 'accelerate', 'deepspeed'):\n"
            "    try:\n"
            "        import importlib.metadata as im; d[m] = im.version(m)\n"
            "    except Exception:\n"
            "        d[m] = None\n"
            "print(json.dumps(d))")
    out = {}
    for rt, py in (("dslaunch", args.dslaunch_python), ("deepspeed", args.peer_python)):
        if rt not in args.runtime_list:
            continue
        env = run_env(rt, args)
        env.pop("DSLAUNCH_AS_DEEPSPEED", None)
        try:
            res = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, env=env)
            out[rt] = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {
                "error": res.stderr[-500:]}
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            out[rt] = {"error": repr(e)}
    return out


def torch_ext_dirs(args) -> list:
    env_dir = os.environ.get("TORCH_EXTENSIONS_DIR")
    return [Path(env_dir)] if env_dir else [Path.home() / ".cache" / "torch_extensions"]


def prebuild(args, configs: list) -> dict:
    """Build the ops the timed runs would JIT-compile, all at once in background processes."""
    procs = {}
    offload = any(c in ("z2off", "z3off", "z3nvme") for c in configs)
    if "deepspeed" in args.runtime_list:
        code = ["import time", "t = time.time()", "from deepspeed.ops.op_builder import CPUAdamBuilder"]
        if offload:
            code.append("CPUAdamBuilder().load(); print('CPUAdam', round(time.time() - t, 1))")
        if args.device == "cuda" and any(c not in ("z2off", "z3off", "z3nvme") for c in configs):
            code += ["from deepspeed.ops.op_builder import FusedAdamBuilder", "t = time.time()",
                     "FusedAdamBuilder().load(); print('FusedAdam', round(time.time() - t, 1))"]
        if "z3nvme" in configs:
            code += ["from deepspeed.ops.op_builder import AsyncIOBuilder", "t = time.time()",
                     "AsyncIOBuilder().load(); print('AsyncIO', round(time.time() - t, 1))"]
        procs["deepspeed"] = [args.peer_python, "-c", "\n".join(code)]
    if "dslaunch" in args.runtime_list:
        ops = ["cpu_adam"]
        if args.device == "cuda":
            ops += ["cuda_fused_adam", "cuda_bf16"]
        if "z3nvme" in configs:
            ops.append("async_io")
        procs["dslaunch"] = [args.dslaunch_python, "-m", "dslaunch.kernels.builder"] + ops
    started = {}
    for rt, cmd in procs.items():
        log_path = args.logs / f"prebuild_{rt}.log"
        logf = open(log_path, "wb")
        started[rt] = (subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=run_env(rt, args),
                                        cwd=bu.REPO, start_new_session=True), time.perf_counter(), log_path, logf)
    result = {}
    deadline = time.perf_counter() + args.prebuild_timeout
    pending = dict(started)
    while pending:
        for rt, (proc, t0, log_path, logf) in list(pending.items()):
            rc = proc.poll()
            if rc is None and time.perf_counter() < deadline:
                continue
            if rc is None:
                bu.kill_group(proc)
                rc = "timeout"
            logf.close()
            del pending[rt]
            result[rt] = {"returncode": rc, "seconds": round(time.perf_counter() - t0, 1),
                          "tail": trim_log(log_path)[-600:]}
            bu.log(f"[bench] prebuild {rt}: rc={rc} {result[rt]['seconds']}s")
        time.sleep(0.2)
    if any(r["returncode"] == "timeout" for r in result.values()):
        # a killed torch JIT build leaves its `lock` file: every later load would wait on it forever
        for d in torch_ext_dirs(args):
            for lock in d.glob("*/*/lock"):
                lock.unlink(missing_ok=True)
                result.setdefault("removed_locks", []).append(str(lock))
    return result


# ------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--size", default="355m", choices=sorted(SIZES))
    p.add_argument("--configs", default="z2off,z3off,z2,z3", help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--script", choices=sorted(SCRIPTS), default="ds")
    p.add_argument("--runtimes", default="dslaunch,deepspeed")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--omp-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--peer-python", default=None, help="python that imports deepspeed (default: the peer venv)")
    p.add_argument("--peer-pythonpath", default="", help="PYTHONPATH entries for the DeepSpeed runs (e.g. /tmp/site)")
    p.add_argument("--dslaunch-python", default=sys.executable)
    p.add_argument("--nvme-path", default="/tmp/bench_gpu_nvme")
    p.add_argument("--cuda-arch", default=None,
                   help="TORCH_CUDA_ARCH_LIST for the JIT builds (default on cuda: the device's capability)")
    p.add_argument("--run-timeout", type=float, default=150.0, help="seconds per run, then killed ('timeout')")
    p.add_argument("--budget", type=float, default=270.0, help="seconds for all runs (prebuild included)")
    p.add_argument("--prebuild", action="store_true", help="build the JIT ops of both runtimes first")
    p.add_argument("--prebuild-timeout", type=float, default=180.0)
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    args = p.parse_args(argv)
    t_begin = time.perf_counter()

    configs = bu.split(args.configs)
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {bad}; choose from {', '.join(CONFIGS)}")
    args.runtime_list = bu.split(args.runtimes)
    if any(r not in RUNTIMES for r in args.runtime_list):
        p.error(f"--runtimes: choose from {', '.join(RUNTIMES)}")
    if "deepspeed" in args.runtime_list and not args.peer_python:
        args.peer_python = bu.peer_python(create=False)
        if not args.peer_python:
            p.error("no DeepSpeed python: pass --peer-python (or --runtimes dslaunch)")
    if args.script == "hf" and args.size not in SIZES:
        p.error("unknown size")
    results = Path(args.results_dir)
    stamp = bu.timestamp()
    args.work = results / f"gpu_train-{args.script}-{stamp}-runs"
    args.logs = results / "logs"
    args.work.mkdir(parents=True, exist_ok=True)
    args.logs.mkdir(parents=True, exist_ok=True)
    json_path = results / f"gpu_train-{args.script}-{stamp}.json"

    info = facts(args)
    if args.device == "cuda" and not args.cuda_arch:
        args.cuda_arch = next((v.get("capability") for v in info.values() if v.get("capability")), None)
    doc = {"benchmark": "bench_gpu_train", "started": bu.now_iso(), "argv": sys.argv[1:],
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "machine": bu.machine(), "git": bu.git_rev(), "versions": info,
           "device_name": next((v.get("device_name") for v in info.values() if v.get("device_name")), None),
           "flops_formula": "6*N*T + 12*L*d*s*T per step (T tokens, N params, L layers, d hidden, s seq)",
           "runs": [], "skipped": [], "summary": {}}

    def save():
        doc["summary"] = summarize(doc["runs"], configs)
        doc["elapsed_s"] = round(time.perf_counter() - t_begin, 1)
        tmp = json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.rename(json_path)

    bu.log(f"[bench] {doc['device_name'] or args.device}; results {json_path}")
    save()
    if args.prebuild:
        doc["prebuild"] = prebuild(args, configs)
        save()

    last_wall = {}
    for rnd in range(args.rounds):
        order = list(args.runtime_list) if rnd % 2 == 0 else list(reversed(args.runtime_list))
        for c in configs:
            for rt in order:
                elapsed = time.perf_counter() - t_begin
                left = args.budget - elapsed
                est = last_wall.get((c, rt), 0.0)
                if left <= 0 or est > left:
                    reason = "budget spent" if left <= 0 else f"last run took {est:.0f}s, {left:.0f}s left"
                    doc["skipped"].append({"runtime": rt, "config": c, "round": rnd, "reason": reason})
                    bu.log(f"[bench] skip {c} {rt} r{rnd}: {reason}")
                    save()
                    continue
                run = one_run(rt, c, rnd, args, timeout=max(20.0, min(args.run_timeout, left)))
                last_wall[(c, rt)] = run["wall_seconds"]
                doc["runs"].append(run)
                save()
                print(line(run), flush=True)
    save()
    print("[bench] summary (dslaunch / deepspeed):", flush=True)
    for c, row in doc["summary"].items():
        a, b, r = row["dslaunch"], row["deepspeed"], row["ratio_dslaunch_over_deepspeed"]
        print(f"[bench]   {c:<7} tok/s {a['tokens_per_s_median']} / {b['tokens_per_s_median']} = {r['tokens_per_s']}"
              f"  TFLOPS {a['tflops_median']} / {b['tflops_median']}  peak GiB {a['peak_gpu_gib_median']} / "
              f"{b['peak_gpu_gib_median']} = {r['peak_gpu_mem']}  loss rel diff {row['loss_max_rel_diff']}",
              flush=True)
    print(f"[bench] json {json_path}", flush=True)
    return 0 if all(r["status"] == "ok" for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
