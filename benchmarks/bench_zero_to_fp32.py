#!/usr/bin/env python
"""Consolidating a ZeRO stage 3 checkpoint to one fp32 state_dict: dslaunch's ``zero_to_fp32.py``
vs DeepSpeed 0.19.8's, on the same-size checkpoint, each written by its own engine.

The model is examples/gpt.py's GPT (default: 15 layers, hidden 1024, vocab 8192, seq 64:
~205M parameters), fp32, Adam, ZeRO stage 3, built under each engine's ``zero.Init``, trained
one step on 2 CPU ranks (gloo) and saved: dslaunch through ``dslaunch run``, DeepSpeed through
the peer venv's ``torchrun`` (benchmarks/peers.py; ``DSLAUNCH_PEER_VENV``).

Then, interleaved over ``--rounds``, each consolidation runs as its own process, started by a
small wrapper that reports its wall time and peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``
of the one child: VmHWM, so mapped file pages the process touched count too):

- dslaunch: ``python <ckpt>/zero_to_fp32.py CKPT OUT.pt`` (the script ``save_checkpoint`` wrote:
  torch alone), and ``dslaunch ckpt to-fp32`` (the library path, the same code);
- DeepSpeed: ``deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(CKPT,
  OUTDIR, max_shard_size=None)`` in the peer venv: the code of the ``zero_to_fp32.py`` DeepSpeed
  writes, called without shard planning because its CLI's default (5GB) needs huggingface_hub,
  which the peer venv lacks; a model this size is one shard either way.

Also measured: an idle python that imports torch (each venv), the baseline the peaks include.
Ratios dslaunch / DeepSpeed of the medians (wall time, and user+system CPU time, which a loaded
machine disturbs less) and of the peaks. Targets (issue 18): peak
RSS <= 0.5x, time <= 1.0x.

    .venv/bin/python benchmarks/bench_zero_to_fp32.py [--rounds 2] [--layers 15 --d-model 1024]
        [--work DIR [--make-only]]   # keep (and reuse) the checkpoints in DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "peer_scripts"))

CONFIG = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
          "gradient_accumulation_steps": 1, "steps_per_print": 1_000_000,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": 3}}
ENV = dict(os.environ, OMP_NUM_THREADS="1")
# the measuring wrapper: run argv[1:], print its wall time and peak RSS (the only child waited)
WRAP = ("import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "w = time.perf_counter() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps({'rc': p.returncode, 'wall_s': w, 'peak_rss_bytes': r.ru_maxrss * 1024,"
        " 'cpu_s': r.ru_utime + r.ru_stime,"
        " 'tail': (p.stdout + p.stderr)[-2000:]}))")


def measure(cmd: list) -> dict:
    """Wall time and peak RSS of ``cmd`` run as a child of a fresh wrapper process."""
    p = subprocess.run([sys.executable, "-c", WRAP, *map(str, cmd)], capture_output=True,
                       text=True, env=ENV, cwd=ROOT, timeout=1800)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out["rc"] != 0:
        raise SystemExit(f"{cmd} failed:\n{out['tail']}")
    return {"wall_s": round(out["wall_s"], 3), "cpu_s": round(out["cpu_s"], 3),
            "peak_rss_bytes": out["peak_rss_bytes"]}


# -- the rank side: one step, then save (run by `dslaunch run` or the peer's torchrun) ----------

def rank_main(engine_name: str, ckpt: str, layers: int, d_model: int, vocab: int) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import torch
    import torch.distributed as dist

    from gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=vocab, seq_len=64, n_layer=layers, n_head=8, d_model=d_model)
    if engine_name == "deepspeed":
        import deepspeed as ds

        ds.init_distributed(dist_backend="gloo")
    else:
        import dslaunch as ds

        ds.init_distributed()
    torch.manual_seed(0)
    with ds.zero.Init(config_dict_or_path=CONFIG):
        model = GPT(cfg)
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    tok = torch.randint(0, vocab, (1, cfg.seq_len), generator=g)
    engine.backward(engine(tok, tok))
    engine.step()
    engine.save_checkpoint(ckpt)
    if rank == 0:
        n = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
        print("PARAMS " + json.dumps({"params": n, "world": world}), flush=True)


def _make_dslaunch(ck: Path, args) -> str:
    cfg = ck.parent / "ds_config.json"
    cfg.write_text(json.dumps(CONFIG))
    dslaunch = [sys.executable, "-c", "import sys; from dslaunch.cli import main; sys.exit(main())"]
    p = subprocess.run(dslaunch + ["run", "--nproc-per-node", "2", "--config", str(cfg),
                                   __file__, "--rank", "dslaunch", str(ck), *_model_args(args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=3600,
                       env=dict(ENV, PYTHONPATH=str(ROOT)))
    if p.returncode != 0:
        raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
    return p.stdout


def _make_deepspeed(ck: Path, peer: str, args) -> str:
    torchrun = str(Path(peer).with_name("torchrun"))
    p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", __file__, "--rank",
                        "deepspeed", str(ck), *_model_args(args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=3600, env=ENV)
    if p.returncode != 0:
        raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
    return p.stdout


def _model_args(args) -> list:
    return ["--layers", str(args.layers), "--d-model", str(args.d_model), "--vocab",
            str(args.vocab)]


def _params(out: str) -> int:
    line = next(ln for ln in out.splitlines() if "PARAMS {" in ln)
    return json.loads(line.split("PARAMS ", 1)[1])["params"]


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--work", default=None, help="keep the checkpoints here (default: a temp dir)")
    ap.add_argument("--make-only", action="store_true",
                    help="write the two checkpoints into --work and stop")
    ap.add_argument("--rank", nargs=2, metavar=("ENGINE", "CKPT"), help=argparse.SUPPRESS)
    ap.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        return rank_main(a.rank[0], a.rank[1], a.layers, a.d_model, a.vocab)

    import benchutil as bu

    peer = bu.peer_python(create=False)
    if peer is None:
        raise SystemExit("no DeepSpeed peer venv: run benchmarks/peers.py (DSLAUNCH_PEER_VENV)")
    load_start = bu.loadavg()
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_zero_to_fp32_"))
    work.mkdir(parents=True, exist_ok=True)
    ours_ck, ds_ck = work / "dslaunch_ck", work / "deepspeed_ck"
    made = work / "params.json"  # checkpoints of this size already in --work: reused
    want = {"model": _model_args(a)}
    if made.exists() and json.loads(made.read_text()).get("model") == want["model"]:
        params, ds_params = json.loads(made.read_text())["params"]
    else:
        bu.log("saving the dslaunch checkpoint")
        params = _params(_make_dslaunch(ours_ck, a))
        bu.log("saving the DeepSpeed checkpoint")
        ds_params = _params(_make_deepspeed(ds_ck, peer, a))
        made.write_text(json.dumps(dict(want, params=[params, ds_params])))
    if a.make_only:
        return
    from dslaunch.engine.storage.files import write_to_fp32_script

    write_to_fp32_script(str(ours_ck))  # this checkout's script, also into a reused checkpoint
    ds_call = ("import sys\nfrom deepspeed.utils.zero_to_fp32 import "
               "convert_zero_checkpoint_to_fp32_state_dict as c\n"
               "c(sys.argv[1], sys.argv[2], max_shard_size=None)")
    cmds = {
        "dslaunch_script": [sys.executable, ours_ck / "zero_to_fp32.py", ours_ck,
                            work / "ours.pt"],
        "dslaunch_cli": [sys.executable, "-c",
                         "import sys; from dslaunch.cli import main; sys.exit(main())",
                         "ckpt", "to-fp32", ours_ck, work / "ours_cli.pt"],
        "deepspeed": [peer, "-c", ds_call, ds_ck, work / "ds_out"],
    }
    baselines = {"python_torch": measure([sys.executable, "-c", "import torch"]),
                 "peer_python_torch": measure([peer, "-c", "import torch"]),
                 "peer_python_torch_deepspeed": measure([peer, "-c", "import torch, deepspeed"])}
    runs: dict = {k: [] for k in cmds}
    for r in range(a.rounds):
        order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
        for name in order:
            bu.log(f"round {r}: {name}")
            runs[name].append(measure(cmds[name]))
    model_fp32 = 4 * params

    def summary(name):
        walls = [m["wall_s"] for m in runs[name]]
        peak = max(m["peak_rss_bytes"] for m in runs[name])
        return {"runs": runs[name], "median_wall_s": statistics.median(walls),
                "median_cpu_s": statistics.median(m["cpu_s"] for m in runs[name]),
                "peak_rss_bytes": peak, "peak_rss_x_model_fp32": round(peak / model_fp32, 3)}

    res = {k: summary(k) for k in cmds}
    ds = res["deepspeed"]
    ratios = {k: {"time": round(res[k]["median_wall_s"] / ds["median_wall_s"], 3),
                  "cpu_time": round(res[k]["median_cpu_s"] / ds["median_cpu_s"], 3),
                  "peak_rss": round(res[k]["peak_rss_bytes"] / ds["peak_rss_bytes"], 3)}
              for k in ("dslaunch_script", "dslaunch_cli")}
    result = {
        "bench": "zero_to_fp32", "when": bu.now_iso(), "machine": bu.machine(),
        "git": bu.git_rev(), "loadavg_start": load_start, "loadavg_end": bu.loadavg(),
        "deepspeed": bu.pkg_version("deepspeed", peer), "torch": bu.pkg_version("torch"),
        "model": f"examples/gpt.py GPT layers={a.layers} d_model={a.d_model} vocab={a.vocab} "
                 "seq=64, fp32, Adam, ZeRO stage 3 (zero.Init), 2 CPU ranks, one step",
        "params": params, "deepspeed_params": ds_params, "model_fp32_bytes": model_fp32,
        "checkpoint_bytes": {"dslaunch": _dir_bytes(ours_ck), "deepspeed": _dir_bytes(ds_ck)},
        "baselines": baselines, "results": res,
        "ratios_vs_deepspeed": ratios,
        "targets": {"peak_rss": 0.5, "time": 1.0},
        "peak_rss_counting": "ru_maxrss of the consolidating process (VmHWM: anonymous memory "
                             "and the mapped file pages it touched), baseline included",
    }
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    path = bu.save_json(result, "zero_to_fp32", Path(a.out_dir) if a.out_dir else None)
    print(json.dumps({k: result[k] for k in ("params", "model_fp32_bytes", "baselines",
                                             "ratios_vs_deepspeed")}, indent=1))
    for k, v in res.items():
        print(f"{k}: median {v['median_wall_s']:.2f}s (cpu {v['median_cpu_s']:.2f}s), peak RSS "
              f"{v['peak_rss_bytes'] / 2**20:.0f} MiB ({v['peak_rss_x_model_fp32']}x fp32 model)")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
