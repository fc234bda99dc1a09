#!/usr/bin/env python
"""ZeRO++ and MiCS across hosts: bytes that cross hosts per step and tokens/s, on rate-limited
fake hosts, dslaunch vs DeepSpeed 0.19.8 in one run.

    sudo DSLAUNCH_PEER_VENV=/path/to/peer-venv .venv/bin/python benchmarks/bench_zeropp.py
        [--hosts 2,4] [--ranks-per-host 2] [--rate 1gbit] [--steps 8] [--warmup 3] [--repeats 1]
        [--configs zero3,hpz,...] [--model 4,384,6] [--reuse-hosts]
    sudo .venv/bin/python benchmarks/bench_zeropp.py --quick      # 2 hosts, few steps: a smoke run

Hosts: the fake hosts of tests/infra (one network namespace and sshd each), brought up under the
machine-wide lock /run/dslaunch-netns.lock (benchmarks/fake_hosts.py) and taken down at the end
when this run brought them up. Each host's eth0 gets a token bucket (tests/infra/netns_shape.sh,
tbf, egress) of --rate; the two ranks of a host share its namespace, so their traffic goes over
lo, unshaped. Only rate limiting: netem (delay, loss) is not built into this kernel, so no latency
is added. The shaping is cleared at the end, whatever happens.

Configurations (zero_optimization keys only, over --base-zero, by default
stage3_max_reuse_distance=0 and stage3_prefetch_bucket_size=4e6: each unit is released after its
forward use and gathered again in backward, as for a model too large to keep gathered; the rest
as bench_train: examples/gpt.py's GPT, Adam lr 1e-3, fp32, micro-batch 4 per rank,
OMP_NUM_THREADS=1, gloo on CPU), round-robin:
  zero3          stage 3
  hpz            + zero_hpz_partition_size = ranks per host
  qwz+hpz        + zero_quantized_weights
  qwz+qgz+hpz    + zero_quantized_gradients
  mics           stage 3, mics_shard_size = ranks per host
  deepspeed/zero3, deepspeed/hpz   the same keys under DeepSpeed (its pdsh launcher, peer venv)
dslaunch's ranks start with `dslaunch run -H hostfile --launcher ssh` (benchmarks/dslaunch_train.py),
DeepSpeed's with its own `deepspeed --hostfile ... --launcher pdsh` (peer_scripts/deepspeed_train.py).
A configuration that dslaunch's config layer refuses, or that fails, is recorded with its error
and the run goes on.

Measured per run: bytes that crossed hosts per step: each host's eth0 byte counters (its own
namespace's, /proc/net/dev, the counters `ip -s link` shows there), sampled by the lowest rank of
every host before the first step and after each step; the transmitted bytes of all hosts summed
over the timed steps (after --warmup) and divided by their number. Beside it, the root
namespace's ends of the links (/sys/class/net/dsl-vN/statistics) over the whole job (start-up
included). tokens/s: tokens per step / median over the timed steps of the slowest rank's step.
Per topology: medians over repeats, ratios vs dslaunch's plain ZeRO-3 and vs DeepSpeed, and the
issue's targets with met / not met. JSON to stdout and benchmarks/results/zeropp-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peer_scripts"))
sys.path.insert(0, str(HERE))

import benchutil as bu  # noqa: E402
import netcounters  # noqa: E402
from zero_config import format_zero_extra, parse_zero_extra, train_config  # noqa: E402

PY = sys.executable
DSLAUNCH = [PY, "-c", "from dslaunch.cli import main; main()"]
UNSUPPORTED_EXIT = 3  # dslaunch_train.py's
OURS = ("zero3", "hpz", "qwz+hpz", "qwz+qgz+hpz", "mics")
PEER = ("deepspeed/zero3", "deepspeed/hpz")
# Release every gathered unit after its forward use, so that backward gathers it again: no reuse
# window, and a prefetch bucket of about two blocks of the default model (DeepSpeed's default,
# 5e7 elements, prefetches the whole model and keeps what it prefetched until backward uses it;
# below one block, dslaunch prefetches nothing: it starts no unit larger than the bucket).
BASE_ZERO = "stage3_max_reuse_distance=0,stage3_prefetch_bucket_size=4000000"
NO_DELAY = ("only the rate is limited: netem (delay, loss) is not built into this kernel "
            "(CONFIG_NET_SCH_NETEM unset, no loadable modules), so no latency is added")


# --------------------------------------------------------------------------------- configurations


def zero_keys(name: str, ranks_per_host: int) -> dict:
    """The zero_optimization keys (beyond stage 3) of a configuration."""
    base = name.split("/")[-1]
    hpz = {"zero_hpz_partition_size": ranks_per_host}
    return {
        "zero3": {},
        "hpz": hpz,
        "qwz+hpz": {"zero_quantized_weights": True, **hpz},
        "qwz+qgz+hpz": {"zero_quantized_weights": True, "zero_quantized_gradients": True, **hpz},
        "mics": {"mics_shard_size": ranks_per_host, "mics_hierarchical_params_gather": False},
    }[base]


def configurations(names: list, ranks_per_host: int, base: dict | None = None) -> list:
    """``base``: zero_optimization keys every configuration shares (--base-zero)."""
    out = []
    for name in names:
        if name not in OURS + PEER:
            raise SystemExit(f"--configs: {name!r} is not one of {', '.join(OURS + PEER)}")
        out.append({"name": name, "runtime": "deepspeed" if name.startswith("deepspeed/") else "dslaunch",
                    "zero": {**(base or {}), **zero_keys(name, ranks_per_host)}})
    return out


def refusal(c: dict, world: int, micro_batch: int) -> str | None:
    """dslaunch's config error for this configuration, if its config layer refuses it."""
    if c["runtime"] != "dslaunch":
        return None
    from dslaunch.config import ConfigError, resolve_config

    cfg = train_config(3, "fp32", False, micro_batch, 1e-3, json.dumps(c["zero"]))
    try:
        resolve_config(cfg, world_size=world, check_supported=True)
    except ConfigError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------------ one run


def command(c: dict, hostfile: Path, out_dir: Path, args, peer_py: str | None) -> tuple:
    """(argv, env changes) that train configuration ``c`` on the hosts of ``hostfile``."""
    script_args = ["--out", str(out_dir), "--stage", "3", "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--micro-batch", str(args.micro_batch), "--model", args.model,
                   "--vocab", str(args.vocab)]
    if c["zero"]:
        script_args += ["--zero-extra", format_zero_extra(c["zero"])]
    port = str(bu.free_port())
    if c["runtime"] == "dslaunch":
        return ([*DSLAUNCH, "run", "-H", str(hostfile), "--launcher", "ssh", "--master-port", port,
                 "--grace-period", "2", str(HERE / "dslaunch_train.py"), *script_args], {})
    peer_bin = Path(peer_py).parent
    return ([str(peer_bin / "deepspeed"), "--hostfile", str(hostfile), "--launcher", "pdsh",
             "--master_addr", "host1", "--master_port", port, str(HERE / "peer_scripts" / "deepspeed_train.py"),
             *script_args],
            {"PATH": f"{peer_bin}:{os.environ.get('PATH', '')}", "PYTHONPATH": None})


def write_env_file(workdir: Path) -> None:
    """Both launchers read ``.deepspeed_env`` in the working directory and export it to every rank
    on every host (DeepSpeed's pdsh runner exports little of its own environment)."""
    (workdir / ".deepspeed_env").write_text("OMP_NUM_THREADS=1\nBENCH_NETDEV=eth0\nPYTHONUNBUFFERED=1\n")


def veth_counters(n_hosts: int) -> dict:
    """Root-namespace ends of the links: dsl-vN's tx is what host N received, rx what it sent."""
    out = {}
    for i in range(1, n_hosts + 1):
        try:
            rx, tx = netcounters.read_sysfs(f"dsl-v{i}")
        except OSError:
            continue
        out[f"host{i}"] = {"sent": rx, "received": tx}
    return out


def counters_delta(before: dict, after: dict) -> dict:
    hosts = {h: {k: after[h][k] - before[h][k] for k in ("sent", "received")} for h in after if h in before}
    return {"hosts": hosts, "sent_bytes": sum(v["sent"] for v in hosts.values()),
            "received_bytes": sum(v["received"] for v in hosts.values())}


def run_once(c: dict, topo: dict, workdir: Path, rep: int, args, peer_py, hosts) -> dict:
    out_dir = workdir / f"{topo['name']}_{c['name'].replace('/', '_')}_r{rep}"
    out_dir.mkdir(parents=True)
    argv, env_changes = command(c, topo["hostfile"], out_dir, args, peer_py)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PDSH_RCMD_TYPE": "ssh"}
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    for k in ("DSLAUNCH_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "NODE_RANK", "BENCH_ZERO_EXTRA"):
        env.pop(k, None)
    before = veth_counters(topo["hosts"])
    t0 = time.perf_counter()
    log_path = out_dir / "launcher.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            bu.kill_group(proc)
            rc = "timeout"
        except BaseException:  # interrupted: end the job before the hosts go down
            bu.kill_group(proc)
            raise
    wall = time.perf_counter() - t0
    after = veth_counters(topo["hosts"])
    left = {h: hosts.reap(h) for h in topo["host_names"]}
    run = {"config": c["name"], "topology": topo["name"], "repeat": rep, "command": shlex.join(argv),
           "returncode": rc, "wall_seconds": round(wall, 2), "whole_job_link_bytes": counters_delta(before, after)}
    if any(left.values()):
        run["processes_reaped_after"] = left
    ranks = [json.loads(f.read_text()) for f in sorted(out_dir.glob("rank*.json"))]
    tail = log_path.read_text(errors="replace")[-4000:]
    if (out_dir / "unsupported.json").exists():
        run.update(status="refused", message=json.loads((out_dir / "unsupported.json").read_text())["message"])
        return run
    if rc != 0 or len(ranks) != topo["world"]:
        run.update(status="failed", message=f"exit {rc}, {len(ranks)}/{topo['world']} rank results",
                   log_tail=tail[-2500:])
        return run
    run.update(status="ok", **measure(ranks, args.warmup, args.steps))
    return run


def measure(ranks: list, warmup: int, steps: int) -> dict:
    """tokens/s and inter-host bytes per step of one job, from its ranks' result files."""
    from bench_train import summarise_ranks

    s = summarise_ranks(ranks)
    net = netcounters.window_bytes(ranks, warmup, steps)
    return {"tokens_per_s": s["tokens_per_s"], "step_seconds_median": s["step_seconds_median"],
            "tokens_per_step": s["tokens_per_step"], "num_params": s["num_params"],
            "peak_rss_mb_max": s["peak_rss_mb_max"], "losses": s["losses"],
            "inter_host_bytes_per_step": net["tx_bytes_per_step"], "inter_host_window": net,
            "omp_num_threads_per_rank": s["omp_num_threads_per_rank"]}


# ------------------------------------------------------------------------------------------ summary


def summarise(configs: list, runs: list) -> list:
    """Per configuration: medians over the ok repeats, else the first run's status and error."""
    rows = []
    for c in configs:
        rs = [r for r in runs if r["config"] == c["name"]]
        ok = [r for r in rs if r["status"] == "ok"]
        row = {"name": c["name"], "runtime": c["runtime"], "zero_optimization": {"stage": 3, **c["zero"]}}
        if not ok:
            row.update(status=rs[0]["status"] if rs else "not run", message=rs[0].get("message") if rs else None)
            rows.append(row)
            continue
        row.update(status="ok", runs=len(ok),
                   tokens_per_s=bu.median([r["tokens_per_s"] for r in ok]),
                   tokens_per_s_runs=[r["tokens_per_s"] for r in ok],
                   inter_host_bytes_per_step=bu.median([r["inter_host_bytes_per_step"] for r in ok]),
                   inter_host_bytes_per_step_runs=[r["inter_host_bytes_per_step"] for r in ok],
                   whole_job_inter_host_bytes=bu.median([r["whole_job_link_bytes"]["sent_bytes"] for r in ok]),
                   losses=ok[0]["losses"])
        rows.append(row)
    index = {r["name"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        if row["status"] != "ok":
            continue
        refs = {"zero3": "zero3", "deepspeed/zero3": "deepspeed/zero3", "deepspeed/hpz": "deepspeed/hpz"}
        row["ratios"] = {}
        for key, ref_name in refs.items():
            ref = index.get(ref_name)
            if ref is None or ref_name == row["name"]:
                continue
            row["ratios"][f"vs_{key}"] = {
                # > 1: this configuration sends fewer bytes between hosts / trains faster
                "inter_host_bytes_reduction": bu.ratio(ref["inter_host_bytes_per_step"],
                                                       row["inter_host_bytes_per_step"]),
                "tokens_per_s": bu.ratio(row["tokens_per_s"], ref["tokens_per_s"]),
                "loss_max_abs_diff": bu.loss_diff(row["losses"], ref["losses"]),
            }
    return rows


TARGETS = [
    # (what, configuration, reference, measure, threshold): measure = ratio keys of summarise()
    ("qwZ+qgZ+hpZ sends >= 3x fewer inter-host bytes than plain ZeRO-3", "qwz+qgz+hpz", "zero3",
     "inter_host_bytes_reduction", 3.0),
    ("qwZ+qgZ+hpZ trains >= 1.5x faster than plain ZeRO-3 on the shaped link", "qwz+qgz+hpz", "zero3",
     "tokens_per_s", 1.5),
    ("plain ZeRO-3 tokens/s >= 1.0x DeepSpeed's ZeRO-3", "zero3", "deepspeed/zero3", "tokens_per_s", 1.0),
    ("hpZ tokens/s >= 1.0x DeepSpeed's hpZ", "hpz", "deepspeed/hpz", "tokens_per_s", 1.0),
]


def targets(rows: list) -> list:
    """The issue's targets, each met (true / false) or not measured (null, with why)."""
    index = {r["name"]: r for r in rows}
    out = []
    for what, name, ref, key, threshold in TARGETS:
        t = {"target": what, "configuration": name, "reference": ref, "measure": key, "threshold": threshold}
        row, base = index.get(name), index.get(ref)
        missing = [n for n, r in ((name, row), (ref, base)) if r is None or r["status"] != "ok"]
        if missing:
            t.update(value=None, met=None, why=", ".join(
                f"{n}: {index[n]['status'] if n in index else 'not run'}" for n in missing))
        else:
            value = row["ratios"][f"vs_{ref}"][key]
            t.update(value=value, met=value is not None and value >= threshold)
        out.append(t)
    return out


def print_table(topo_name: str, rows: list, tgts: list) -> None:
    bu.log(f"\n{topo_name}: {'configuration':<18} {'status':<8} {'tokens/s':>9} {'MB/step x-host':>15}  "
           "vs zero3 (bytes reduction, tokens/s)")
    for r in rows:
        if r["status"] != "ok":
            msg = " / ".join((r.get("message") or "").splitlines())
            bu.log(f"      {r['name']:<18} {r['status']:<8} {msg[:150]}")
            continue
        v = r["ratios"].get("vs_zero3")
        vs = f"{v['inter_host_bytes_reduction']}x, {v['tokens_per_s']}x" if v else "-"
        bu.log(f"      {r['name']:<18} {'ok':<8} {r['tokens_per_s']:>9.1f} "
               f"{r['inter_host_bytes_per_step'] / 1e6:>15.2f}  {vs}")
    for t in tgts:
        bu.log(f"      target: {t['target']}: {t['value']} -> "
               f"{'met' if t['met'] else 'NOT met' if t['met'] is False else 'not measured (' + t['why'] + ')'}")


# --------------------------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", default=None, help="host counts, e.g. 2,4 (default 2,4; --quick 2)")
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="egress rate per host (tc syntax), or 'none'")
    p.add_argument("--configs", default=",".join(OURS + PEER))
    p.add_argument("--no-peer", action="store_true", help="leave DeepSpeed's configurations out")
    p.add_argument("--base-zero", default=BASE_ZERO,
                   help="zero_optimization keys of every configuration (key=value,...; '' for none). The "
                        "default releases each gathered unit after its forward use, so backward gathers "
                        "again (the regime of a model too large to keep gathered, where hpZ pays)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 8; --quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --quick 1)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--model", default="4,384,6", help="layers,d_model,heads of examples/gpt.py's GPT")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--quick", action="store_true", help="2 hosts, 3 steps: checks the harness")
    p.add_argument("--reuse-hosts", action="store_true",
                   help="use fake hosts found up (not brought up under the lock) instead of waiting")
    p.add_argument("--results-dir", default=str(bu.RESULTS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    args.host_counts = [int(x) for x in bu.split(args.hosts or ("2" if args.quick else "2,4"))]
    if args.steps is None:
        args.steps = 3 if args.quick else 8
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    names = bu.split(args.configs)
    if args.no_peer:
        names = [n for n in names if n not in PEER]
    args.config_names = names
    if any(h < 2 for h in args.host_counts) or args.ranks_per_host < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--hosts >= 2 each, --ranks-per-host and --steps >= 1, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_zeropp: needs root (network namespaces, tc)")
    # SIGTERM, and SIGINT even when started in the background (where it is ignored), unwind
    # through the finally blocks: the job ended, the shaping cleared, the hosts taken down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from fake_hosts import FakeHosts

    configs = configurations(args.config_names, args.ranks_per_host, parse_zero_extra(args.base_zero))
    peer_py = None
    if any(c["runtime"] == "deepspeed" for c in configs):
        peer_py = bu.peer_python(create=False)
        if not peer_py or not (Path(peer_py).parent / "deepspeed").exists():
            bu.log("DeepSpeed peer venv unavailable (DSLAUNCH_PEER_VENV): its configurations are skipped")
            configs = [c for c in configs if c["runtime"] != "deepspeed"]
            peer_py = None
    result = {
        "benchmark": "bench_zeropp", "command": shlex.join([PY] + sys.argv), "started": bu.now_iso(),
        "machine": bu.machine(), "loadavg_before": bu.loadavg(),
        "versions": {"torch": bu.pkg_version("torch"), "dslaunch_git": bu.git_rev(),
                     "deepspeed": bu.pkg_version("deepspeed", peer_py) if peer_py else None},
        "settings": {
            "hosts": args.host_counts, "ranks_per_host": args.ranks_per_host,
            "link": {"rate_per_host_egress": args.rate, "how": "tbf on eth0 of every fake host's namespace "
                     "(tests/infra/netns_shape.sh); two ranks of one host talk over lo, unshaped",
                     "delay": NO_DELAY},
            "model": f"examples/gpt.py GPT layers,d_model,heads={args.model}, vocab {args.vocab}, seq 128",
            "micro_batch": args.micro_batch, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
            "base_zero_optimization": {"stage": 3, **parse_zero_extra(args.base_zero)},
            "precision": "fp32", "optimizer": "Adam lr 1e-3 (config optimizer.type)", "omp_num_threads": 1,
            "inter_host_bytes": "sum over hosts of eth0 tx bytes (each host's own namespace) over the timed "
                                "steps, per step; sampled by the lowest rank of each host between steps",
            "tokens_per_s": "tokens per step / median over timed steps of the slowest rank's step time",
            "quick": args.quick},
        "configurations": [c["name"] for c in configs], "topologies": {}, "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-zeropp-"))
    write_env_file(work)
    try:
        with FakeHosts(max(args.host_counts), reuse=args.reuse_hosts) as hosts:
            if args.rate != "none":
                result["settings"]["link"]["tc"] = hosts.shape(args.rate)
            for n in args.host_counts:
                run_topology(n, configs, args, work, peer_py, hosts, result)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    result.update(finished=bu.now_iso(), loadavg_after=bu.loadavg())
    result = scrub_paths(result, {str(work): "<tmp>", str(Path(peer_py).parent.parent) if peer_py else None:
                                  "<peer-venv>", str(Path(PY).parent): "<venv>/bin", str(bu.REPO) + "/": ""})
    path = None if args.no_save else bu.save_json(result, "zeropp", Path(args.results_dir))
    print(json.dumps(result, indent=1))
    if path:
        bu.log(f"\nJSON written to {path}")
    return 0


def scrub_paths(result: dict, subs: dict) -> dict:
    """The result with this machine's paths replaced by placeholders (commands, log tails)."""
    text = json.dumps(result)
    for path, placeholder in sorted(subs.items(), key=lambda kv: -len(kv[0] or "")):
        if path:
            text = text.replace(json.dumps(path)[1:-1], placeholder)
    return json.loads(text)


def run_topology(n: int, configs: list, args, work: Path, peer_py, hosts, result: dict) -> None:
    name = f"{n}x{args.ranks_per_host}"
    host_names = [f"host{i}" for i in range(1, n + 1)]
    hostfile = work / f"hostfile-{name}"
    hostfile.write_text("".join(f"{h} slots={args.ranks_per_host}\n" for h in host_names))
    topo = {"name": name, "hosts": n, "host_names": host_names, "hostfile": hostfile,
            "world": n * args.ranks_per_host}
    refused = {c["name"]: refusal(c, topo["world"], args.micro_batch) for c in configs}
    runs = []
    for c in configs:
        if refused[c["name"]]:
            runs.append({"config": c["name"], "topology": name, "repeat": 0, "status": "refused",
                         "message": refused[c["name"]]})
            bu.log(f"[{name}] {c['name']}: refused: {refused[c['name']]}")
    failed = set()
    for rep in range(args.repeats):
        for c in configs:
            if refused[c["name"]] or c["name"] in failed:
                continue
            bu.log(f"[{name} {rep + 1}/{args.repeats}] {c['name']} ...")
            run = run_once(c, topo, work, rep, args, peer_py, hosts)
            runs.append(run)
            if run["status"] == "ok":
                bu.log(f"    {run['tokens_per_s']} tokens/s, {run['inter_host_bytes_per_step'] / 1e6:.2f} MB "
                       f"across hosts per step, wall {run['wall_seconds']} s")
            else:
                failed.add(c["name"])  # a later round would only fail again
                bu.log(f"    {run['status']}: {run.get('message')}\n    "
                       + (run.get("log_tail") or "")[-1200:].replace("\n", "\n    "))
    rows = summarise(configs, runs)
    tgts = targets(rows)
    result["topologies"][name] = {"hosts": n, "ranks_per_host": args.ranks_per_host, "world_size": topo["world"],
                                  "summary": rows, "targets": tgts}
    result["runs"].extend(runs)
    print_table(name, rows, tgts)


if __name__ == "__main__":
    sys.exit(main())
