"""1-bit Adam / 0/1 Adam / 1-bit LAMB vs Adam / LAMB: losses, bytes and step time, measured.

Part 1 (convergence and bytes): each optimizer trains the example GPT on ``--nproc`` ranks (gloo)
through ``dslaunch run`` with tests/scripts/onebit_train.py, which records every step's loss and
the bytes each collective booked in ``engine.comm_stats()``: ``bytes`` (payload handed to the
collective) and ``sent_bytes`` (what this rank sends to the others: ring all-reduce
``2(N-1)/N`` x payload, all_gather ``(N-1)`` x input, all_to_all ``(N-1)/N`` x input; the
definition is ``dslaunch/engine/comm/collectives.sent_bytes``, the same for the baseline and the compressed
path). The warmup (``freeze_step`` / ``var_freeze_step``) is ``--warmup-frac`` of the steps (15%,
DeepSpeed's figure); ``--schedule decay`` (default) puts every optimizer under the same
WarmupDecayLR. Reported per optimizer: the loss curve, the final loss (mean of the last 10%
of the steps, and on held-out batches), sent bytes per rank per step in the warmup and in the
compression stage, their ratio to an fp32 all-reduce of the same gradients (the Adam run's
measured bytes) and to a bf16 one (half of it), the end-to-end ratio; payload ratios beside.

Part 2 (``--slow-link RATE``): 2 ranks in 2 network namespaces joined by one veth pair, each
end rate-limited with ``tc ... tbf`` (the kernel has no netem). Each rank is started inside its
namespace with the launcher variables (RANK, WORLD_SIZE, MASTER_ADDR...) that dslaunch's
``init_distributed`` reads, as under torchrun or srun, because ``dslaunch run`` reaches other
hosts over ssh and the shared fake hosts (tests/infra, bridge dsl-br0) belong to the multi-host
tests, which may be running. Adam and 1-bit Adam (15% warmup) alternate ``--repeats`` times on a
bigger GPT; reported: median step time in warmup and compression stage, the part of it spent
inside the engine's collectives (``comm_s_*``: comm_stats seconds, waiting on the link and on
the other rank included), and the bytes the veth
really transmitted (TCP/IP headers and the rendezvous included) against ``comm_stats``'s sent
bytes. Namespaces ``onebit-n0/1`` (203.0.113.1-2, TEST-NET-3, no route out) are removed at the
end. Needs root.

DeepSpeed's published figures for reference: up to 5x less communication end to end, 16x less
in the compression stage vs fp16 gradients, same convergence as Adam at 15% warmup.

    python benchmarks/bench_onebit.py --steps 1000 --out benchmarks/results/onebit-conv.json
    python benchmarks/bench_onebit.py --only "" --slow-link 300mbit \
        --out benchmarks/results/onebit-slowlink.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "onebit_train.py"
PY = sys.executable
CLI = [PY, "-c", "import sys; from dslaunch.cli import main; sys.exit(main())"]


def optimizer_configs(steps: int, warmup: int, lr: float, lamb_lr: float) -> dict:
    common = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    adam, lamb = {**common, "lr": lr}, {**common, "lr": lamb_lr}
    return {
        "Adam": {"type": "Adam", "params": adam},
        "OneBitAdam": {"type": "OneBitAdam", "params": {**adam, "freeze_step": warmup}},
        "ZeroOneAdam": {"type": "ZeroOneAdam", "params": {
            **adam, "var_freeze_step": warmup, "var_update_scaler": 16,
            "local_step_scaler": max(1, (steps - warmup) // 4), "local_step_clipper": 4}},
        "Lamb": {"type": "Lamb", "params": lamb},
        "OneBitLamb": {"type": "OneBitLamb", "params": {**lamb, "freeze_step": warmup}},
    }


def zero_one_variants(specs) -> list:
    """``--zo-variant LABEL:key=value,key=value`` -> [(LABEL, {key: int or float})]: extra
    ZeroOneAdam runs (same lr, betas, data and schedule as Adam) compared with the one Adam run."""
    out = []
    for spec in specs or ():
        label, _, body = spec.partition(":")
        params = {}
        for item in filter(None, body.split(",")):
            key, _, value = item.partition("=")
            params[key.strip()] = float(value) if "." in value or "e" in value else int(value)
        out.append((label, params))
    return out


def model_args(args) -> list:
    return ["--layers", str(args.layers), "--d-model", str(args.d_model), "--seq", str(args.seq)]


def schedule(steps: int, lr: float) -> dict:
    """WarmupDecayLR: linear lr warmup over the first 10% of the steps, linear decay to 0 (the
    shape of the BERT recipes the 1-bit papers used; the same for every optimizer)."""
    return {"type": "WarmupDecayLR", "params": {
        "total_num_steps": steps, "warmup_num_steps": max(1, steps // 10), "warmup_min_lr": 0.0,
        "warmup_max_lr": lr, "warmup_type": "linear"}}


def write_config(workdir: Path, name: str, opt: dict, micro_batch: int, steps: int = 0,
                 decay: bool = False) -> Path:
    cfg = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
           "steps_per_print": 10 ** 9, "optimizer": opt}
    if decay:
        cfg["scheduler"] = schedule(steps, opt["params"]["lr"])
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def run(name, opt, args, workdir: Path) -> list:
    out = workdir / name
    cmd = [*CLI, "run", "--nproc-per-node", str(args.nproc), str(SCRIPT), "--out", str(out),
           "--steps", str(args.steps), "--eval-batches", "8", "--seed", str(args.seed),
           *model_args(args),
           "--deepspeed_config", str(write_config(workdir, name, opt, args.micro_batch,
                                                   args.steps, args.schedule == "decay"))]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name}: job failed\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    recs = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(args.nproc)]
    recs[0]["wall_s"] = time.perf_counter() - t0
    return recs


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def summarise(rec: dict, fp32_sent: float, fp32_payload: float) -> dict:
    comp = rec["compressing"]
    sent = [sum(b.values()) for b in rec["step_sent"]]
    payload = [sum(b.values()) for b in rec["step_bytes"]]
    warm_s = [b for b, c in zip(sent, comp) if not c]
    comp_s = [b for b, c in zip(sent, comp) if c]
    k = max(10, len(rec["losses"]) // 10)
    out = {
        "final_loss_train_mean_last": sum(rec["losses"][-k:]) / k, "last_k": k,
        "final_loss_heldout": rec.get("eval_loss"),
        "warmup_steps": len(warm_s), "compression_steps": len(comp_s),
        "sent_bytes_per_step_warmup": mean(warm_s),
        "sent_bytes_per_step_compression": mean(comp_s),
        "sent_bytes_total": sum(sent), "payload_bytes_total": sum(payload),
        "ratio_end_to_end_vs_fp32": fp32_sent * len(sent) / sum(sent) if sum(sent) else None,
        "ratio_end_to_end_vs_fp32_payload":
            fp32_payload * len(payload) / sum(payload) if sum(payload) else None,
        "wall_s": rec.get("wall_s"),
        "losses": rec["losses"], "sent_bytes_per_step": sent,
    }
    if comp_s:
        comp_p = [b for b, c in zip(payload, comp) if c]
        out["ratio_compression_vs_fp32"] = fp32_sent / mean(comp_s)
        out["ratio_compression_vs_bf16"] = fp32_sent / 2 / mean(comp_s)
        out["ratio_compression_vs_fp32_payload"] = fp32_payload / mean(comp_p)
    return out


def convergence(args, result: dict) -> None:
    warmup = max(1, round(args.steps * args.warmup_frac))
    configs = optimizer_configs(args.steps, warmup, args.lr, args.lamb_lr)
    wanted = [k for k in args.only.split(",") if k]
    configs = {k: v for k, v in configs.items() if k in wanted}
    for label, params in zero_one_variants(args.zo_variant):
        configs[f"ZeroOneAdam[{label}]"] = {"type": "ZeroOneAdam", "params": {
            **configs.get("Adam", optimizer_configs(args.steps, warmup, args.lr,
                                                    args.lamb_lr)["Adam"])["params"], **params}}
    if not configs:
        return
    if "Adam" not in configs:
        raise SystemExit("--only must include Adam (its measured bytes are the fp32 baseline)")
    result.update({"steps": args.steps, "warmup": warmup, "nproc": args.nproc, "seed": args.seed,
                   "micro_batch": args.micro_batch, "lr": args.lr, "lamb_lr": args.lamb_lr,
                   "schedule": args.schedule,
                   "model": {"layers": args.layers, "d_model": args.d_model, "seq": args.seq}})
    with tempfile.TemporaryDirectory() as tmp:
        recs = {name: run(name, opt, args, Path(tmp)) for name, opt in configs.items()}
    adam = recs["Adam"][0]
    fp32_sent = mean([sum(b.values()) for b in adam["step_sent"]])
    fp32_payload = mean([sum(b.values()) for b in adam["step_bytes"]])
    result["num_params"] = adam["num_params"]
    result["fp32_allreduce_per_step"] = {"sent_bytes": fp32_sent, "payload_bytes": fp32_payload}
    opts = result["optimizers"] = {}
    for name, r in recs.items():
        opts[name] = summarise(r[0], fp32_sent, fp32_payload)
        opts[name]["ranks_in_sync"] = len({x["param_sha"] for x in r}) == 1
        if configs[name]["type"] == "ZeroOneAdam":
            opts[name]["params"] = configs[name]["params"]
    pairs = [("OneBitAdam", "Adam"), ("ZeroOneAdam", "Adam"), ("OneBitLamb", "Lamb")]
    pairs += [(k, "Adam") for k in opts if k.startswith("ZeroOneAdam[")]
    for comp, base in pairs:
        if comp in opts and base in opts:
            for key in ("final_loss_train_mean_last", "final_loss_heldout"):
                a, b = opts[comp][key], opts[base][key]
                opts[comp][f"{key}_vs_{base}"] = (a - b) / b


# -- part 2: the slow link ---------------------------------------------------------------------

NS, DEV, IPS = ("onebit-n0", "onebit-n1"), ("onebit-v0", "onebit-v1"), ("203.0.113.1",
                                                                           "203.0.113.2")


def ip(*a, check=True):
    return subprocess.run(["ip", *a], check=check, capture_output=True, text=True)


def link_down() -> None:
    for ns in NS:
        ip("netns", "del", ns, check=False)  # takes its veth end (and so the pair) with it


def link_up(rate: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit("--slow-link needs root (network namespaces, tc)")
    link_down()
    if "203.0.113." in ip("-4", "addr").stdout:
        raise SystemExit("203.0.113.0/24 is in use on this machine; the slow link needs it")
    for ns in NS:
        ip("netns", "add", ns)
    ip("link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1], "netns",
       NS[1])
    for ns, dev, addr in zip(NS, DEV, IPS):
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", dev, "up")
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                        "rate", rate, "burst", "512kb", "latency", "100ms"], check=True)


def tx_bytes(r: int) -> int:
    return int(subprocess.run(["ip", "netns", "exec", NS[r], "cat",
                               f"/sys/class/net/{DEV[r]}/statistics/tx_bytes"],
                              capture_output=True, text=True, check=True).stdout)


def run_slow(name, opt, args, workdir: Path, port: int) -> dict:
    cfg = write_config(workdir, name, opt, args.slow_micro_batch)
    out = workdir / name
    before = [tx_bytes(r) for r in range(2)]
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "MASTER_ADDR": IPS[0], "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": DEV[r],
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        cmd = ["ip", "netns", "exec", NS[r], PY, str(SCRIPT), "--out", str(out), "--steps",
               str(args.slow_steps), "--layers", str(args.slow_layers), "--d-model",
               str(args.slow_d_model), "--seq", str(args.slow_seq), "--deepspeed_config",
               str(cfg)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{name} on the slow link failed:\n" + "\n".join(x[-2000:] for x in logs))
    wire = [tx_bytes(r) - before[r] for r in range(2)]
    rec = json.loads((out / "rank_0.json").read_text())
    comp = rec["compressing"]
    secs = rec["step_seconds"][1:]  # the first step pays for lazy set-up
    comm_s = rec["step_comm_seconds"][1:]
    comp = comp[1:]
    warm = [s for s, c in zip(secs, comp) if not c]
    compr = [s for s, c in zip(secs, comp) if c]
    warm_comm = [s for s, c in zip(comm_s, comp) if not c]
    compr_comm = [s for s, c in zip(comm_s, comp) if c]
    sent = sum(sum(b.values()) for b in rec["step_sent"])
    med = lambda xs: statistics.median(xs) if xs else None
    return {"step_s_warmup_median": med(warm),
            "step_s_compression_median": med(compr),
            "comm_s_warmup_median": med(warm_comm),
            "comm_s_compression_median": med(compr_comm),
            "train_loop_s": sum(rec["step_seconds"]),
            "veth_tx_bytes_per_rank": wire, "comm_stats_sent_bytes_rank0": sent,
            "num_params": rec["num_params"]}


def slow_link(args, result: dict) -> None:
    steps = args.slow_steps
    warmup = max(1, round(steps * args.warmup_frac))
    base = {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    configs = {"Adam": {"type": "Adam", "params": base},
               "OneBitAdam": {"type": "OneBitAdam", "params": {**base, "freeze_step": warmup}}}
    runs = {k: [] for k in configs}
    link_up(args.slow_link)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):  # interleaved: the machine's load hits both alike
                for j, (name, opt) in enumerate(configs.items()):
                    runs[name].append(run_slow(name, opt, args, Path(tmp), 29400 + 2 * i + j))
    finally:
        link_down()
    med = lambda xs: statistics.median(xs) if xs and None not in xs else None
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "step_s_warmup_median": med([r["step_s_warmup_median"] for r in rs]),
            "step_s_compression_median": med([r["step_s_compression_median"] for r in rs]),
            "comm_s_warmup_median": med([r["comm_s_warmup_median"] for r in rs]),
            "comm_s_compression_median": med([r["comm_s_compression_median"] for r in rs]),
            "train_loop_s_median": med([r["train_loop_s"] for r in rs]),
            "veth_tx_bytes_per_rank_median": med([sum(r["veth_tx_bytes_per_rank"]) / 2
                                                  for r in rs]),
            "comm_stats_sent_bytes_rank0": rs[0]["comm_stats_sent_bytes_rank0"],
            "repeats": rs}
    a, b = summary["Adam"], summary["OneBitAdam"]
    result["slow_link"] = {
        "rate": args.slow_link, "steps": steps, "warmup": warmup, "repeats": args.repeats,
        "model": {"layers": args.slow_layers, "d_model": args.slow_d_model,
                  "seq": args.slow_seq, "micro_batch": args.slow_micro_batch,
                  "num_params": runs["Adam"][0]["num_params"]},
        "optimizers": summary,
        "speedup_compression_stage": a["step_s_warmup_median"] / b["step_s_compression_median"],
        "speedup_train_loop": a["train_loop_s_median"] / b["train_loop_s_median"],
        "veth_bytes_ratio_end_to_end": (a["veth_tx_bytes_per_rank_median"]
                                        / b["veth_tx_bytes_per_rank_median"]),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup-frac", type=float, default=0.15)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--lamb-lr", type=float, default=0.01)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="model init and data order (the rank "
                   "script's --seed): the same for every optimizer of a run")
    p.add_argument("--schedule", choices=("constant", "decay"), default="decay",
                   help="lr: constant, or WarmupDecayLR (10%% warmup, linear decay to 0)")
    p.add_argument("--only", default="Adam,OneBitAdam,ZeroOneAdam,Lamb,OneBitLamb",
                   help="comma list of optimizers for part 1 (empty: skip part 1)")
    p.add_argument("--zo-variant", action="append", default=[],
                   help="extra ZeroOneAdam run, LABEL:key=value,... (repeatable), e.g. "
                        "'ds-default:var_freeze_step=100000,local_step_scaler=32678,"
                        "local_step_clipper=16'")
    p.add_argument("--slow-link", default="", help="tbf rate, e.g. 300mbit (empty: skip part 2)")
    p.add_argument("--slow-steps", type=int, default=40)
    p.add_argument("--slow-layers", type=int, default=4)
    p.add_argument("--slow-d-model", type=int, default=256)
    p.add_argument("--slow-seq", type=int, default=64)
    p.add_argument("--slow-micro-batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="", help="JSON file (default: stdout only)")
    args = p.parse_args(argv)
    result = {"bench": "onebit", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "loadavg_start": os.getloadavg()}
    convergence(args, result)
    if args.slow_link:
        slow_link(args, result)
    result["loadavg_end"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    brief = dict(result)
    if "optimizers" in brief:
        brief["optimizers"] = {k: {kk: v[kk] for kk in v
                                   if kk not in ("losses", "sent_bytes_per_step")}
                               for k, v in result["optimizers"].items()}
    if "slow_link" in brief:
        brief["slow_link"] = {**brief["slow_link"], "optimizers": {
            k: {kk: vv for kk, vv in v.items() if kk != "repeats"}
            for k, v in brief["slow_link"]["optimizers"].items()}}
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
