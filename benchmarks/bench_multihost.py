#!/usr/bin/env python
"""Multi-host launch numbers on the fake hosts (network namespaces with sshd, tests/infra/).

A trivial 2-host x 2-slot job (peer_scripts/trivial_dist.py: import torch, init_process_group
(gloo), barrier, exit), OMP_NUM_THREADS=1, per launcher:
  dslaunch-ssh / -pdsh / -openmpi / -mpich / -slurm (srun inside salloc), as users run them
                   (preflight check of every host included); dslaunch-ssh-nopreflight without it
  torchrun-static: one `torchrun --nnodes 2 --node-rank N --master-addr host1` per host, started
                   over ssh in parallel (the usual way without a multi-node launcher)
  deepspeed-pdsh:  DeepSpeed's own multi-node launcher (peer venv, when it exists)
Measured: the whole command's wall time (median over interleaved repeats); the time from a rank's
failure on host2 (rank 3 raises; the time it raised is stamped by the rank) to the launcher's exit;
and the time from a silent host loss (host2's link down, then all its processes killed) to the
launcher's exit, with whether anything of the job was left on host1 (capped: a launcher still
running after --loss-cap seconds is recorded as hung, then killed).

    .venv/bin/python benchmarks/bench_multihost.py [--repeats 3] [--no-slurm] [--no-loss]

Needs root. Takes the fake hosts' lock (/run/dslaunch-netns.lock, benchmarks/fake_hosts.py), brings
them (and SLURM) up if they are not, and takes down what it started.
JSON to stdout and benchmarks/results/multihost-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "peer_scripts"))
sys.path.insert(0, str(HERE))

import benchutil as bu  # noqa: E402
from fake_hosts import FakeHosts, job_pids, reap  # noqa: E402

INFRA = REPO / "tests" / "infra"
TRIVIAL = HERE / "peer_scripts" / "trivial_dist.py"
PY = sys.executable
DSLAUNCH = [PY, "-c", "from dslaunch.cli import main; main()"]
NET_ENV = {"OMPI_MCA_oob_tcp_if_include": "198.51.100.0/24",
           "OMPI_MCA_btl_tcp_if_include": "198.51.100.0/24", "HYDRA_IFACE": "dsl-br0",
           "OMP_NUM_THREADS": "1", "PDSH_RCMD_TYPE": "ssh"}


def sh(script, *args, env=None, timeout=180):
    return subprocess.run(["bash", str(INFRA / script), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def port() -> int:
    return random.randint(20000, 40000)


def wait_clean(host: str, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = job_pids(host)
        if not left:
            return []
        time.sleep(0.2)
    return job_pids(host)


def command(launcher: str, workdir: Path, script_args: list, peer_py: str | None) -> tuple:
    """(argv, env) running the 2x2 job; the whole command is what is timed."""
    hf = workdir / "hostfile"
    p = str(port())
    if launcher.startswith("dslaunch-"):
        name = launcher.split("-", 1)[1]
        extra = []
        if name.endswith("-nopreflight"):  # what the preflight check costs
            name, extra = name[:-len("-nopreflight")], ["--no-preflight"]
        argv = [*DSLAUNCH, "run", "-H", str(hf), "--launcher", name, "--master-port", p, *extra,
                "--grace-period", "2", str(TRIVIAL), *script_args]
        if name == "slurm":
            argv = ["salloc", "--quiet", "-N2", "-w", "host1,host2", "--ntasks-per-node=2", *argv]
        return argv, {}
    if launcher == "torchrun-static":
        torchrun = str(Path(PY).parent / "torchrun")
        parts = []
        for n, h in enumerate(("host1", "host2")):
            remote = (f"cd {shlex.quote(str(workdir))} && OMP_NUM_THREADS=1 exec "
                      + shlex.join([torchrun, "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2",
                                    "--master-addr", "host1", "--master-port", p, str(TRIVIAL), *script_args]))
            parts.append(shlex.join(["ssh", "-T", "-o", "BatchMode=yes", h, "--", remote]))
        # both agents in parallel; the command ends when both have ended; exit code: worst
        script = f"{parts[0]} & a=$!; {parts[1]} & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra > rb ? ra : rb))"
        return ["bash", "-c", script], {}
    if launcher == "deepspeed-pdsh":
        ds = str(Path(peer_py).parent / "deepspeed")
        return [ds, "--hostfile", str(hf), "--launcher", "pdsh", "--master_addr", "host1", "--master_port", p,
                str(TRIVIAL), *script_args], {"PATH": f"{Path(peer_py).parent}:{os.environ['PATH']}"}
    raise ValueError(launcher)


def run_once(launcher, workdir, peer_py, timeout):
    argv, env = command(launcher, workdir, [], peer_py)
    t0 = time.time()
    proc = subprocess.run(argv, cwd=workdir, env={**os.environ, **NET_ENV, **env}, capture_output=True,
                          text=True, timeout=timeout)
    wall = time.time() - t0
    ok = proc.returncode == 0
    for h in ("host1", "host2"):
        reap(h)
    if not ok:
        bu.log(f"  {launcher} failed rc={proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}")
    return {"wall_s": round(wall, 3), "rc": proc.returncode, "ok": ok}


def run_fail(launcher, workdir, peer_py, cap):
    stamps = Path(tempfile.mkdtemp(dir=workdir, prefix="stamps-"))
    argv, env = command(launcher, workdir, ["--stamps", str(stamps), "--fail-rank", "3",
                                            "--sleep-after-fail", "120"], peer_py)
    proc = subprocess.Popen(argv, cwd=workdir, env={**os.environ, **NET_ENV, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    res = {}
    try:
        _, err = proc.communicate(timeout=cap)
        t_exit = time.time()
        res = {"rc": proc.returncode, "root_cause_named": "rank 3" in err}
    except subprocess.TimeoutExpired:
        t_exit = None
        res = {"hung": True, "still_running_after_s": cap}
    try:
        failed_at = json.loads((stamps / "rank3.json").read_text())["failed_at"]
        if t_exit:
            res["fail_to_exit_s"] = round(t_exit - failed_at, 3)
    except (OSError, ValueError, KeyError):
        res["error"] = "rank 3 never reached its failure"
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    res["left_behind"] = {h: len(wait_clean(h, 10 if t_exit else 0)) for h in ("host1", "host2")}
    for h in ("host1", "host2"):
        reap(h)
    return res


def run_loss(launcher, workdir, peer_py, cap):
    stamps = Path(tempfile.mkdtemp(dir=workdir, prefix="stamps-"))
    argv, env = command(launcher, workdir, ["--stamps", str(stamps), "--fail-rank", "99",
                                            "--sleep-after-fail", "300"], peer_py)
    proc = subprocess.Popen(argv, cwd=workdir, env={**os.environ, **NET_ENV, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    res = {}
    try:
        deadline = time.monotonic() + 120
        while len(list(stamps.glob("rank*.json"))) < 4:
            if time.monotonic() > deadline or proc.poll() is not None:
                return {"error": "ranks never all ready"}
            time.sleep(0.2)
        t_loss = time.time()
        r = sh("netns_host.sh", "down", "host2", timeout=30)
        if r.returncode != 0:
            return {"error": r.stderr}
        try:
            _, err = proc.communicate(timeout=cap)
            res = {"loss_to_exit_s": round(time.time() - t_loss, 3), "rc": proc.returncode,
                   "host_named": "host2" in err}
        except subprocess.TimeoutExpired:
            res = {"hung": True, "still_running_after_s": cap}
        res["left_on_host1"] = len(job_pids("host1")) if res.get("hung") else len(wait_clean("host1", 15))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        reap("host1")  # what a hung launcher left behind: end it for the next run
        sh("netns_host.sh", "up", "host2", timeout=60)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--launchers", default="dslaunch-ssh,dslaunch-ssh-nopreflight,dslaunch-pdsh,"
                                           "dslaunch-openmpi,dslaunch-mpich,dslaunch-slurm,torchrun-static,"
                                           "deepspeed-pdsh")
    ap.add_argument("--fail-launchers", default="dslaunch-ssh,dslaunch-pdsh,dslaunch-openmpi,dslaunch-mpich,"
                                                "dslaunch-slurm,torchrun-static,deepspeed-pdsh")
    ap.add_argument("--loss-launchers", default="dslaunch-ssh,dslaunch-pdsh,dslaunch-openmpi,dslaunch-mpich,"
                                                "torchrun-static,deepspeed-pdsh")
    ap.add_argument("--loss-cap", type=float, default=45.0)
    ap.add_argument("--fail-cap", type=float, default=45.0)
    ap.add_argument("--no-slurm", action="store_true")
    ap.add_argument("--no-loss", action="store_true")
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_multihost: needs root (network namespaces)")
    launchers = [x for x in args.launchers.split(",") if x]
    if args.no_slurm:
        launchers = [x for x in launchers if x != "dslaunch-slurm"]
    peer_py = bu.peer_python(create=False)
    if not peer_py or not (Path(peer_py).parent / "deepspeed").exists():
        launchers = [x for x in launchers if x != "deepspeed-pdsh"]

    # the fake hosts under the machine-wide lock (fake_hosts.py); ones found up are reused
    hosts = FakeHosts(2, reuse=True, slurm="dslaunch-slurm" in launchers)
    hosts.__enter__()
    if "dslaunch-slurm" in launchers and not Path("/run/dslaunch-slurm").exists():
        launchers.remove("dslaunch-slurm")
    workdir = Path(tempfile.mkdtemp(prefix="bench-multihost-"))
    (workdir / "hostfile").write_text("host1 slots=2\nhost2 slots=2\n")
    result = {"kind": "multihost", "when": bu.now_iso(), "machine": bu.machine(), "git": bu.git_rev(),
              "load_before": bu.loadavg(), "hosts": "2 network namespaces x 2 slots (gloo, CPU)",
              "launch": {}, "fail_to_exit": {}, "host_loss_to_exit": {}}
    try:
        runs = {name: [] for name in launchers}
        for i in range(args.repeats):
            for name in launchers:  # interleaved: A B C A B C ...
                bu.log(f"launch {name} #{i + 1}")
                runs[name].append(run_once(name, workdir, peer_py, args.timeout))
        for name, rs in runs.items():
            walls = [r["wall_s"] for r in rs if r["ok"]]
            result["launch"][name] = {"median_wall_s": bu.median(walls), "runs": rs}
        base = result["launch"].get("torchrun-static", {}).get("median_wall_s")
        for v in result["launch"].values():
            v["ratio_vs_torchrun_static"] = bu.ratio(v["median_wall_s"], base)
        for name in [x for x in args.fail_launchers.split(",") if x in launchers]:
            bu.log(f"fail-fast {name}")
            result["fail_to_exit"][name] = run_fail(name, workdir, peer_py, args.fail_cap)
        if not args.no_loss:
            for name in [x for x in args.loss_launchers.split(",") if x in launchers]:
                bu.log(f"host loss {name}")
                result["host_loss_to_exit"][name] = run_loss(name, workdir, peer_py, args.loss_cap)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        hosts.__exit__(None, None, None)
    result["load_after"] = bu.loadavg()
    print(json.dumps(result, indent=1))
    if not args.no_save:
        path = bu.save_json(result, "multihost", bu.RESULTS)
        bu.log(f"saved {path}")


if __name__ == "__main__":
    main()
