#!/usr/bin/env python
"""How fast a job trains again after a fault, and what faults cost over a whole run.

(a) recovery (needs root: the fake hosts of tests/infra, network namespaces with sshd): a job of
    N hosts x --slots ranks, plus --spares spare hosts (a hostfile "spare" where the launcher
    has --nnodes: with one lost host of two, only a spare leaves a majority answering)
    (tests/scripts/inject_train.py: the engine, a checkpoint every --save-every steps, resumed
    by engine.load_checkpoint at start) loses its last host
    (host-loss: `netns_host.sh down`, link down then every process killed) or has its last rank
    stuck outside a collective (hang: `--inject hang:...`, with `--hang-timeout 15` where the
    launcher has it). Measured from the fault to the first step of the restarted job, split from
    the lines the job prints (each stamped on arrival, the ranks' own clock for theirs):
    detect (fault -> the launcher reports it), re-plan (-> it says it restarts), restart (-> the
    restarted rank 0 has its process group and engine), load (-> its checkpoint is loaded),
    first step (-> its first step). The launcher's own incident record (incidents.jsonl, when it
    writes one) is kept beside it. Peer, same hosts, same script: one `torchrun --nnodes 1:N
    --max-restarts 3 --rdzv-backend c10d` per host over ssh; a side that does not train again
    within --cap seconds is reported as ">= cap". --a-recover restart,in-process measures dslaunch
    both ways ("dslaunch" restarts every rank, "dslaunch-in-process" runs `--recover in-process`:
    rank 0 keeps its process, so training again is its first step after the fault, and re-plan
    is up to the launcher's "recovering" line).
(b) goodput (this host, no root): the same job for --minutes with a fault every --fault-every
    seconds (kill, and hang when the launcher has --hang-timeout; each fault on its own attempt,
    `--max-restarts`), against the same job without faults: useful steps/s (the final global
    step, redone steps not counted twice) and their ratio.
(e) in-process vs restart (this host, no root): the same fixed number of steps three times (per
    --repeats, each repeat in a rotated order): without faults, then with one fault every
    --fault-every seconds of the job's wall time under `--recover in-process` and under
    `--recover restart`. The schedule is the job's, not each process's: `--inject KIND:rank=R,at=T`
    (T = --fault-every, 2x, 3x ...; launcher/inject.py: on the job's clock, fired once per job by
    whichever process of the rank runs then, restarted or replacement), --e-kinds taken in turn
    (kill: rank 1 SIGKILLs itself; hang: rank 0 blocks outside any collective, --hang-timeout).
    Goodput = the fault-free wall time over the faulty one (same steps); per run the faults due
    within its wall and those that fired, and per fault the launcher's incident record: path
    (in-process or restart, and why), seconds to training, its split (detect, abort, re-plan,
    rebuild, state transfer) and steps redone. Checkpoints every --save-every steps in all three
    (a restart resumes from the last one; an in-process recovery needs none). --keep-logs DIR keeps
    each run's launcher output and log dir.
(c) async checkpoint stall, (d) watchdog cost: benchmarks/bench_async_checkpoint.py and
    benchmarks/bench_watchdog_cost.py, run as they are when present (their JSON kept here),
    else "not run".

    .venv/bin/python benchmarks/bench_resilience.py                 # a: 2 and 4 hosts; b: 4 min each
    sudo .venv/bin/python benchmarks/bench_resilience.py --parts a --hosts 2,4 --cap 180
    .venv/bin/python benchmarks/bench_resilience.py --parts b --minutes 10 --fault-every 120
    .venv/bin/python benchmarks/bench_resilience.py --smoke         # b only, ~30 s
    .venv/bin/python benchmarks/bench_resilience.py --parts e --e-steps 1500 --fault-every 40
    .venv/bin/python benchmarks/bench_resilience.py --parts e --e-zero 2 --e-kinds kill,hang \
        --hang-timeout 4 --e-steps 4500 --fault-every 120 --save-every 50   # ~10 min a run

JSON to stdout and benchmarks/results/resilience-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "peer_scripts"))
sys.path.insert(0, str(REPO))

import benchutil as bu  # noqa: E402

from dslaunch.launcher import inject  # noqa: E402

INFRA = REPO / "tests" / "infra"
SCRIPT = REPO / "tests" / "scripts" / "inject_train.py"
PY = sys.executable
DSLAUNCH = [PY, "-c", "from dslaunch.cli import main; main()"]
REPORT = re.compile(r"lost|hang|stuck|desync|no progress|job failed|failed", re.I)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a,b,c,d", help="which of a,b,c,d to run")
    ap.add_argument("--hosts", default="2,4", help="(a) host counts")
    ap.add_argument("--slots", type=int, default=1, help="(a) ranks per host")
    ap.add_argument("--spares", type=int, default=1,
                    help="(a) spare hosts beside the N (hostfile 'spare' where the launcher has --nnodes; "
                         "torchrun: standby agents started after the first rendezvous)")
    ap.add_argument("--scenarios", default="host-loss,hang", help="(a) host-loss,hang")
    ap.add_argument("--peers", default="torchrun", help="(a) torchrun, or '' for none")
    ap.add_argument("--cap", type=float, default=180.0, help="(a) give up on training again after this")
    ap.add_argument("--a-recover", default="restart",
                    help="(a) dslaunch's recovery paths to measure: restart, in-process or both "
                         "(restart,in-process; in-process where the launcher has --recover)")
    ap.add_argument("--hang-timeout", type=float, default=15.0)
    ap.add_argument("--fresh-hosts", action="store_true",
                    help="(a) take down fake hosts already there and bring up max(--hosts) healthy ones")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=4.0, help="(b) length of each run")
    ap.add_argument("--fault-every", type=float, default=120.0, help="(b) seconds of training between faults")
    ap.add_argument("--ranks", type=int, default=2, help="(b) ranks on this host")
    ap.add_argument("--save-every", type=int, default=10,
                    help="checkpoint interval, steps; (a)'s fault comes at 1.5 intervals")
    ap.add_argument("--step-sleep", type=float, default=0.1, help="seconds of 'work' per step")
    ap.add_argument("--steps", type=int, default=0,
                    help="(b) a fixed number of steps instead of --minutes (one kill halfway)")
    ap.add_argument("--smoke", action="store_true", help="(b) only, 30 steps per run")
    ap.add_argument("--e-steps", type=int, default=1500, help="(e) steps of each run")
    ap.add_argument("--e-zero", type=int, default=0, choices=(0, 1, 2),
                    help="(e) ZeRO stage of the job (1-2: in-process recovery keeps shard copies)")
    ap.add_argument("--e-kinds", default="kill",
                    help="(e) fault kinds, taken in turn: kill (rank 1 killed), or kill,hang (then "
                         "rank 0 hung): one fault every --fault-every s of the job's wall time")
    ap.add_argument("--keep-logs", type=Path, default=None,
                    help="(e) copy each run's launcher output, --log-dir (incidents, rank logs) and "
                         "run.json (path, schedule, exit code, wall time) here, one directory a run")
    ap.add_argument("--e-runs", default="clean,in-process,restart",
                    help="(e) which runs to make (goodput needs a clean one, here or in --e-from-logs)")
    ap.add_argument("--e-from-logs", type=Path, default=None,
                    help="(e) run nothing: the figures again from the directories --keep-logs left "
                         "(same --fault-every and --step-sleep as the runs)")
    ap.add_argument("--results-dir", type=Path, default=bu.RESULTS)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    args.part_list = [p for p in args.parts.split(",") if p]
    args.host_list = [int(h) for h in args.hosts.split(",") if h]
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    args.peer_list = [p for p in args.peers.split(",") if p]
    args.a_recover_list = [p for p in args.a_recover.split(",") if p]
    args.fault_step = max(3, args.save_every * 3 // 2)  # a checkpoint exists, half an interval redone
    for bad, ok, what in ((args.part_list, "abcde", "--parts"),
                          (args.scenario_list, ("host-loss", "hang"), "--scenarios"),
                          (args.peer_list, ("torchrun",), "--peers"),
                          (args.a_recover_list, ("restart", "in-process"), "--a-recover")):
        if any(x not in ok for x in bad):
            ap.error(f"{what}: one of {', '.join(ok)}")
    if any(h < 2 for h in args.host_list):
        ap.error("--hosts: at least 2 (one is lost)")
    if args.ranks < 2:
        ap.error("--ranks: at least 2")
    if args.smoke:
        args.part_list, args.save_every, args.step_sleep = ["b"], 5, 0.05
        args.steps = args.steps or 30
    return args


# ---- one running job, every line stamped on arrival --------------------------------------------
class Job:
    def __init__(self, procs: list):
        self.lines: list = []  # (arrival time, stream, text)
        self.q: queue.Queue = queue.Queue()
        self.procs = []
        for p in procs:
            self.add(p)

    def add(self, p):
        self.procs.append(p)
        for name in ("stdout", "stderr"):
            threading.Thread(target=self._read, args=(getattr(p, name), name), daemon=True).start()

    def _read(self, stream, name):
        for line in stream:
            item = (time.time(), name, line.rstrip("\n"))
            self.lines.append(item)
            self.q.put(item)

    def wait(self, pred, timeout: float):
        """The first new line for which pred(t, stream, text) is true, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.q.get(timeout=0.2)
            except queue.Empty:
                if all(p.poll() is not None for p in self.procs) and self.q.empty():
                    return None
                continue
            if pred(*item):
                return item
        return None

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def rank_line(text: str):
    """(word, rank, fields, clock, attempt) of an inject_train.py line, prefix or not; else None."""
    text = re.sub(r"^\[[^\]]*\] ", "", text)
    parts = text.split()
    if len(parts) < 4 or parts[0] not in ("START", "INIT", "RESUMED", "STEP"):
        return None
    try:
        return parts[0], int(parts[1]), parts[2:-2], float(parts[-2]), int(parts[-1])
    except ValueError:
        return None


def rank0(word: str, min_attempt: int = 0):
    def pred(t, stream, text):
        r = rank_line(text)
        return r is not None and r[0] == word and r[1] == 0 and r[4] >= min_attempt
    return pred


def launcher_features() -> set:
    out = subprocess.run([*DSLAUNCH, "run", "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return {f for f in ("--nnodes", "--hang-timeout", "--recover") if f in out}


def clean(obj, subs: dict):
    """Results name no path of this machine."""
    if isinstance(obj, str):
        for k, v in subs.items():
            obj = obj.replace(k, v)
        return obj
    if isinstance(obj, list):
        return [clean(x, subs) for x in obj]
    if isinstance(obj, dict):
        return {k: clean(v, subs) for k, v in obj.items()}
    return obj


# ---- (a) recovery on the fake hosts ---------------------------------------------------------------
def sh(script, *args, env=None, timeout=180):
    return subprocess.run(["bash", str(INFRA / script), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def healthy_hosts(python: str) -> list:
    names = sorted(re.findall(r"^dsl-(host\d+)", subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                                text=True).stdout, re.M),
                   key=lambda h: int(h[4:]))
    ok = []
    for h in names:
        remote = shlex.join([python, "-c", "import dslaunch.launcher.agent, torch"])
        r = subprocess.run(["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", h, "--", remote],
                           capture_output=True, timeout=60)
        if r.returncode == 0:
            ok.append(h)
    return ok


def reap(hosts: list) -> int:
    """Kill what a run left in the hosts' namespaces (all but their sshd listener)."""
    n = 0
    for h in hosts:
        daemons = set()
        try:
            daemons.add(int(Path(f"/run/dslaunch-infra/sshd-{h}.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
        pids = subprocess.run(["ip", "netns", "pids", f"dsl-{h}"], capture_output=True, text=True).stdout.split()
        for pid in map(int, pids):
            if pid not in daemons:
                try:
                    os.kill(pid, signal.SIGKILL)
                    n += 1
                except ProcessLookupError:
                    pass
    return n


def train_args(ckpt: Path, step_sleep: float, save_every: int) -> list:
    return [str(SCRIPT), "--save-dir", str(ckpt), "--save-every", str(save_every), "--steps", "1000000",
            "--step-sleep", str(step_sleep)]


def start_dslaunch(work, hosts, spares, slots, scenario, features, args, recover="restart"):
    hf = work / "hostfile"
    hf.write_text("".join(f"{h} slots={slots}\n" for h in hosts)
                  + "".join(f"{h} slots={slots} spare\n" for h in spares if "--nnodes" in features))
    world = len(hosts) * slots
    argv = [*DSLAUNCH, "run", "-H", str(hf), "--launcher", "ssh", "--python", str(work / "python"),
            "--max-restarts", "3", "--grace-period", "2", "--omp-threads", "1", "--log-dir", str(work / "logs"),
            "--master-port", str(random.randint(20000, 40000))]
    if "--nnodes" in features:
        argv += ["--nnodes", f"1:{len(hosts)}"]
    if recover != "restart":
        argv += ["--recover", recover]
    if scenario == "hang":
        if "--hang-timeout" in features:
            argv += ["--hang-timeout", f"{args.hang_timeout:g}"]
        argv += ["--inject", f"hang:rank={world - 1},step={args.fault_step}"]
    argv += train_args(work / "ckpt", args.step_sleep, args.save_every)
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return Job([proc])


def torchrun_agent(work, hosts, h, slots, port, env, args):
    torchrun = str(Path(PY).parent / "torchrun")
    remote = (f"cd {shlex.quote(str(work))} && {env} exec "
              + shlex.join([torchrun, "--nnodes", f"1:{len(hosts)}", "--nproc-per-node", str(slots),
                            "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                            f"{hosts[0]}:{port}", "--rdzv-id", f"bench-{port}",
                            *train_args(work / "ckpt", args.step_sleep, args.save_every)]))
    return subprocess.Popen(["ssh", "-T", "-o", "BatchMode=yes", h, "--", remote], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def start_torchrun(work, hosts, slots, scenario, args):
    world = len(hosts) * slots
    env = f"PYTHONPATH={shlex.quote(str(REPO))} OMP_NUM_THREADS=1"
    if scenario == "hang":
        spec = inject.encode([inject.parse_spec(f"hang:rank={world - 1},step={args.fault_step}")])
        env += f" {inject.ENV}={shlex.quote(spec)}"
    port = random.randint(20000, 40000)
    job = Job([torchrun_agent(work, hosts, h, slots, port, env, args) for h in hosts])
    job.spare = lambda h: job.add(torchrun_agent(work, hosts, h, slots, port, env, args))
    return job


def first_after(job, t0, pred):
    for t, stream, text in job.lines:
        if t >= t0 and pred(t, stream, text):
            return t, text
    return None, None


def phases(job, t_fault, launcher: str) -> dict:
    """The split, from the stamped lines (None where a phase left no trace). In process, rank 0
    keeps its process (no INIT, no checkpoint load): re-plan is up to the launcher's "recovering"
    line, and training again its first step after the fault."""
    out = {}
    ours = launcher.startswith("dslaunch")
    first_attempt = 0 if launcher == "dslaunch-in-process" else 1
    t_detect, what = first_after(job, t_fault, lambda t, s, x: s == "stderr" and x.startswith("dslaunch:")
                                 and REPORT.search(x) is not None) if ours else (None, None)
    t_plan, _ = first_after(job, t_fault, lambda t, s, x: s == "stderr" and x.startswith("dslaunch:")
                            and re.search(r"restart|recover", x, re.I)) if ours else (None, None)
    # In process, rank 0 may still finish a step after a rank hung, before anyone noticed: not
    # training again (it read as 0.001 s). Its steps count from the launcher's recover word on.
    t_from = t_fault
    if launcher == "dslaunch-in-process":
        t_word, _ = first_after(job, t_fault, lambda t, s, x: "recovering in process" in x)
        t_from = max(t_fault, t_word) if t_word is not None else t_fault
    marks = {}
    for _t, _s, x in job.lines:
        r = rank_line(x)
        if r and r[1] == 0 and r[4] >= first_attempt and r[3] >= t_from and r[0] not in marks:
            marks[r[0]] = r[3]
    t_init, t_resumed, t_step = marks.get("INIT"), marks.get("RESUMED"), marks.get("STEP")

    def d(a, b):
        return round(b - a, 3) if a is not None and b is not None else None

    out["detect_s"] = d(t_fault, t_detect)
    out["detected_as"] = what
    out["replan_s"] = d(t_detect, t_plan)
    out["restart_s"] = d(t_plan or t_detect, t_init)
    out["load_s"] = d(t_init, t_resumed)
    out["first_step_s"] = d(t_resumed or t_init, t_step)
    out["training_again_s"] = d(t_fault, t_step)
    if launcher == "dslaunch-in-process":  # no new rank 0: the re-plan line to its next step
        out["recover_s"] = d(t_plan or t_detect, t_step)
    return out


def recover_once(launcher, work, hosts, spares, slots, scenario, features, args) -> dict:
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    shutil.rmtree(work / "logs", ignore_errors=True)
    job = (start_dslaunch(work, hosts, spares, slots, scenario, features, args,
                          "in-process" if launcher == "dslaunch-in-process" else "restart")
           if launcher.startswith("dslaunch") else start_torchrun(work, hosts, slots, scenario, args))
    res = {"launcher": launcher, "hosts": len(hosts), "spares": len(spares), "ranks": len(hosts) * slots,
           "scenario": scenario}
    lost = hosts[-1]
    try:
        if launcher == "torchrun" and spares:  # standby agents, once the first round has formed
            if job.wait(rank0("INIT"), 240) is not None:
                for h in spares:
                    job.spare(h)
        if scenario == "host-loss":
            if job.wait(lambda t, s, x: (r := rank_line(x)) is not None and r[0] == "STEP" and r[1] == 0
                        and int(r[2][0]) >= args.fault_step, 240) is None:
                res["error"] = "never reached the fault step: " + " | ".join(x for _, _, x in job.lines[-8:])
                return res
            t_fault = time.time()
            r = sh("netns_host.sh", "down", lost, timeout=30)
            if r.returncode != 0:
                res["error"] = r.stderr.strip()
                return res
        else:
            hit = job.wait(lambda t, s, x: "hangs in _injected_hang" in x, 240)
            if hit is None:
                res["error"] = "the hang never fired: " + " | ".join(x for _, _, x in job.lines[-8:])
                return res
            t_fault = hit[0]
        if launcher == "dslaunch-in-process":
            # rank 0 goes on in its process: its first step after the launcher's recover word (a
            # step it ends just after a rank hangs, before anyone noticed, is not training again)
            word = []

            def trained_again(t, s, x):
                if "recovering in process" in x:
                    word.append(t)
                r = rank_line(x)
                return bool(word) and r is not None and r[0] == "STEP" and r[1] == 0 \
                    and r[3] >= max(t_fault, word[0])

            again = job.wait(trained_again, args.cap)
        else:
            again = job.wait(rank0("STEP", 1), args.cap)
        res.update(phases(job, t_fault, launcher))
        if again is None:
            ended = [p.returncode for p in job.procs if p.poll() is not None]
            res["training_again_s"] = None
            res["training_again"] = (f"never: the job ended (exit {ended[0]}) after {time.time() - t_fault:.0f} s"
                                     if len(ended) == len(job.procs) else f">= {args.cap:g}")
        else:
            res["training_again"] = f"{res['training_again_s']:.1f}"
            time.sleep(5)  # a few heartbeats more: the launcher's incident record learns the resume
    finally:
        job.stop()
        incidents = work / "logs" / "incidents.jsonl"  # complete once the launcher has ended
        if incidents.exists():
            res["incidents"] = [json.loads(x) for x in incidents.read_text().splitlines() if x.strip()]
        res["launcher_tail"] = [x for _, s, x in job.lines if s == "stderr"][-6:]
        if scenario == "host-loss":
            sh("netns_host.sh", "up", lost, timeout=60)
        res["reaped_leftovers"] = reap(hosts + spares)
    return res


def part_a(args, features) -> dict:
    if os.geteuid() != 0:
        return {"status": "not run", "why": "needs root (network namespaces)"}
    work = Path(tempfile.mkdtemp(prefix="bench-resilience-"))
    (work / "python").write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {PY} \"$@\"\n")
    os.chmod(work / "python", 0o755)
    started = False
    try:
        there = Path("/run/dslaunch-infra/env.sh").exists()
        if there and args.fresh_hosts:
            sh("netns_down.sh")
            there = False
        hosts = healthy_hosts(str(work / "python")) if there else []
        if not there:
            r = sh("netns_up.sh", env={"DSL_NODES": str(max(args.host_list) + args.spares),
                                       "DSL_INSTALL_PDSH": "0"})
            if r.returncode != 0:
                return {"status": "not run", "why": f"fake hosts did not come up: {r.stderr[-300:]}"}
            started = True
            hosts = healthy_hosts(str(work / "python"))
        rows = []
        for n in args.host_list:
            if len(hosts) < n + args.spares:
                rows.append({"hosts": n, "status": "not run",
                             "why": f"only {len(hosts)} healthy fake hosts ({', '.join(hosts)}): "
                                    "pass --fresh-hosts"})
                continue
            for scenario in args.scenario_list:
                for i in range(args.repeats):
                    for launcher in [*(("dslaunch" if r == "restart" else "dslaunch-in-process")
                                       for r in args.a_recover_list
                                       if r == "restart" or "--recover" in features), *args.peer_list]:
                        bu.log(f"(a) {launcher} {scenario} {n} hosts #{i + 1}")
                        row = recover_once(launcher, work, hosts[:n], hosts[n:n + args.spares], args.slots,
                                           scenario, features, args)
                        bu.log(f"    training again: {row.get('training_again', row.get('error'))}")
                        rows.append(row)
        return {"status": "ok", "fault_step": args.fault_step, "runs": clean(rows, {str(work): "<work>"}),
                "summary": summarize_a(rows, args.cap)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            sh("netns_down.sh")


def summarize_a(rows, cap: float) -> list:
    out = []
    keys = sorted({(r["scenario"], r["hosts"]) for r in rows if "scenario" in r})
    for scenario, n in keys:
        row = {"scenario": scenario, "hosts": n}
        for launcher in ("dslaunch", "dslaunch-in-process", "torchrun"):
            rs = [r for r in rows if r.get("launcher") == launcher and r.get("scenario") == scenario
                  and r.get("hosts") == n]
            if not rs:
                continue
            row[launcher] = {k: bu.median([r.get(k) for r in rs]) for k in
                             ("detect_s", "replan_s", "restart_s", "load_s", "first_step_s", "recover_s",
                              "training_again_s")}
            row[launcher]["training_again"] = [r.get("training_again", r.get("error")) for r in rs]
        ds, tr = row.get("dslaunch", {}), row.get("torchrun", {})
        row["torchrun_over_dslaunch"] = bu.ratio(tr.get("training_again_s"), ds.get("training_again_s"))
        row["torchrun_over_in_process"] = bu.ratio(tr.get("training_again_s"),
                                                   row.get("dslaunch-in-process", {}).get("training_again_s"))
        if tr and tr.get("training_again_s") is None and ds.get("training_again_s"):
            row["torchrun_over_dslaunch_at_least"] = bu.ratio(cap, ds["training_again_s"])  # it hit the cap
        out.append(row)
    return out


# ---- (b) goodput on this host ----------------------------------------------------------------------
def goodput_run(work, args, features, faults: bool) -> dict:
    duration = args.minutes * 60
    ckpt, logs = work / f"ckpt-{int(faults)}", work / f"logs-{int(faults)}"
    shutil.rmtree(ckpt, ignore_errors=True)
    argv = [*DSLAUNCH, "run", "--nproc-per-node", str(args.ranks), "--omp-threads", "1", "--grace-period", "1",
            "--log-dir", str(logs)]
    specs = []
    if faults and args.steps:
        specs = [f"kill:rank={args.ranks - 1},step={args.steps // 2}"]
        argv += ["--max-restarts", "1", "--inject", specs[0]]
    elif faults:
        kinds = ["kill", "hang"] if "--hang-timeout" in features else ["kill"]
        n = int(duration // args.fault_every) + 1
        for i in range(n):
            rank = 1 + i % (args.ranks - 1)
            specs.append(f"{kinds[i % len(kinds)]}:rank={rank},after={args.fault_every:g}s,attempt={i}")
        argv += ["--max-restarts", str(n)] + [w for s in specs for w in ("--inject", s)]
        if "--hang-timeout" in features:
            argv += ["--hang-timeout", f"{args.hang_timeout:g}"]
    t0 = time.time()
    argv += [str(SCRIPT), "--save-dir", str(ckpt), "--save-every", str(args.save_every),
             "--step-sleep", str(args.step_sleep)]
    argv += ["--steps", str(args.steps)] if args.steps else ["--steps", "1000000000", "--until", f"{t0 + duration:.3f}"]
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    out, err = proc.communicate(timeout=(args.steps * args.step_sleep * 4 if args.steps else duration * 3) + 600)
    wall = time.time() - t0
    done = [int(m.group(1)) for m in re.finditer(r"\] DONE 0 (\d+)", out)]
    steps = done[-1] if done else None
    res = {"faults": faults, "specs": specs, "rc": proc.returncode, "wall_s": round(wall, 3),
           "final_step": steps, "steps_per_s": round(steps / wall, 4) if steps else None,
           "faults_fired": len(re.findall(r"dslaunch inject: ", out)),
           "restarts": len(re.findall(r"^dslaunch: restarting", err, re.M)),
           "steps_made": len(re.findall(r"\] STEP 0 ", out))}
    if proc.returncode != 0:
        res["launcher_tail"] = err.splitlines()[-6:]
    incidents = logs / "incidents.jsonl"
    if incidents.exists():
        res["incidents"] = [json.loads(x) for x in incidents.read_text().splitlines() if x.strip()]
    return res


def part_b(args, features) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    try:
        runs = []
        for i in range(args.repeats):
            for faults in ((False, True) if i % 2 == 0 else (True, False)):
                bu.log(f"(b) goodput {'with' if faults else 'without'} faults, {args.minutes:g} min #{i + 1}")
                runs.append(goodput_run(work, args, features, faults))
        clean_sps = bu.median([r["steps_per_s"] for r in runs if not r["faults"]])
        fault_sps = bu.median([r["steps_per_s"] for r in runs if r["faults"]])
        return {"status": "ok", "minutes": None if args.steps else args.minutes, "steps": args.steps or None,
                "fault_every_s": None if args.steps else args.fault_every, "ranks": args.ranks,
                "steps_per_s_without_faults": clean_sps, "steps_per_s_with_faults": fault_sps,
                "goodput_ratio": bu.ratio(fault_sps, clean_sps), "target": ">= 0.8",
                "runs": clean(runs, {str(work): "<work>"})}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- (e) in-process recovery against restarting every rank --------------------------------------
def e_schedule(kinds: list, every: float, horizon: float) -> list:
    """The job's faults, one every ``every`` s of its wall time (``at=``: on the job's clock, once
    per job, shared by restarted and replacement processes: launcher/inject.py), kinds in turn
    (kill: rank 1, hang: rank 0), up to ``horizon`` s."""
    n = max(1, int(horizon // every))
    return [f"{kinds[i % len(kinds)]}:rank={1 if kinds[i % len(kinds)] == 'kill' else 0},"
            f"at={(i + 1) * every:g}s" for i in range(n)]


PHASE_KEYS = (("detect", "detect_seconds"), ("abort", "stop_seconds"), ("re-plan", "replan_seconds"),
              ("rebuild", "restart_seconds"), ("state", "load_seconds"))


def incident_row(rec: dict) -> dict:
    """One fault as the launcher recorded it (incidents.jsonl): the path, the phases, the cost."""
    return {"kind": rec.get("kind"), "action": rec.get("action"), "culprit_rank": rec.get("culprit_rank"),
            "last_step": rec.get("last_step"), "seconds_to_training": rec.get("seconds_to_training"),
            "steps_redone": rec.get("steps_redone"),
            "split": {label: rec.get(key) for label, key in PHASE_KEYS},
            "reason": str(rec.get("reason", ""))[:240]}


PREFIX = re.compile(r"^\[(?:rank (\d+)|[^\]:]*:(\d+))\] ")
FIRED = re.compile(r"dslaunch inject: (\S+): rank (\d+) \(pid \d+\) (kills|hangs)[^\n]*? at step (\d+)")


def fired_faults(stdout: str, step_sleep: float) -> list:
    """The faults that fired, in order: (spec, rank, step, estimated time). A rank fault fires
    inside ``engine.step()`` of its step, so at about the rank's previous STEP line (its own
    clock) + the script's --step-sleep (to within the step's forward and backward)."""
    last: dict = {}
    out = []
    for line in stdout.splitlines():
        # the launcher's prefix names the rank a line came from (a promoted standby's script may
        # have read its RANK before it had one)
        p = PREFIX.match(line)
        who = int(p.group(1) or p.group(2)) if p else None
        r = rank_line(line)
        if r is not None and r[0] == "STEP":
            last[r[1] if who is None else who] = r[3]
            continue
        m = FIRED.search(line)
        if m:
            rank = int(m.group(2))
            t = last.get(rank)
            out.append({"spec": m.group(1), "rank": rank, "step": int(m.group(4)),
                        "time": None if t is None else round(t + step_sleep, 3)})
    return out


def attach_faults(rows: list, recs: list, fired: list) -> None:
    """Each incident's fault (the latest fired on its culprit rank before the launcher saw it) and
    the time from that fault to training again: for a hang the detection (the hang timeout) is in
    the incident's time, for a kill it is not far from the fault."""
    for row, rec in zip(rows, recs):
        cands = [f for f in fired if f["rank"] == rec.get("culprit_rank") and f["time"] is not None
                 and f["time"] <= rec.get("time", 0) + 0.5]
        if not cands:
            continue
        f = cands[-1]
        row["fault"] = f["spec"]
        if rec.get("seconds_to_training") is not None:
            row["fault_to_training_s"] = round(rec["time"] + rec["seconds_to_training"] - f["time"], 3)
            row["fault_to_detect_s"] = round(rec["time"] - f["time"], 3)


def recover_run(work, args, recover: str | None, tag: str = "") -> dict:
    """One run of --e-steps steps; ``recover``: None (no fault), "restart" or "in-process"."""
    name = (recover or "clean") + tag
    ckpt, logs = work / f"ckpt-{name}", work / f"logs-{name}"
    shutil.rmtree(ckpt, ignore_errors=True)
    argv = [*DSLAUNCH, "run", "--nproc-per-node", str(args.ranks), "--omp-threads", "1",
            "--grace-period", "1", "--log-dir", str(logs)]
    specs: list = []
    if args.e_zero:  # the script's own config with the stage (dslaunch run --config)
        config = work / "zero.json"
        config.write_text(json.dumps({
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "steps_per_print": 10 ** 9,
            "zero_optimization": {"stage": args.e_zero}}))
        argv += ["--config", str(config)]
    timeout = args.e_steps * args.step_sleep * 6 + 600
    if recover:
        kinds = args.e_kinds.split(",")
        specs = e_schedule(kinds, args.fault_every, timeout)
        argv += ["--recover", recover, "--max-restarts", "1000"]
        argv += [w for s in specs for w in ("--inject", s)]
        if "hang" in kinds:
            argv += ["--hang-timeout", f"{args.hang_timeout:g}"]
    argv += [str(SCRIPT), "--save-dir", str(ckpt), "--save-every", str(args.save_every),
             "--step-sleep", str(args.step_sleep), "--steps", str(args.e_steps)]
    t0 = time.time()
    load0 = bu.loadavg()
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=timeout)
    wall = time.time() - t0
    meta = {"recover": recover, "specs": specs, "rc": proc.returncode, "wall_s": round(wall, 3),
            "load_before": load0, "load_after": bu.loadavg()}
    recs = incidents_of(logs)
    res = run_result(meta, proc.stdout, proc.stderr, recs, args)
    if args.keep_logs:
        keep = args.keep_logs / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(t0))}-{name}"
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "stdout.txt").write_text(proc.stdout)
        (keep / "stderr.txt").write_text(proc.stderr)
        (keep / "run.json").write_text(json.dumps(meta))
        if logs.exists():
            shutil.copytree(logs, keep / "logs", dirs_exist_ok=True)
        res["logs_kept"] = keep.name
    return res


def incidents_of(logs: Path) -> list:
    path = logs / "incidents.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run_result(meta: dict, stdout: str, stderr: str, recs: list, args) -> dict:
    """One run's figures from what it left: its launcher's output and incident records."""
    specs, wall = meta["specs"], meta["wall_s"]
    fired = fired_faults(stdout, args.step_sleep)
    res = {"recover": meta["recover"], "schedule": specs[:3] + (["..."] if len(specs) > 3 else []),
           "rc": meta["rc"], "wall_s": wall, "load_before": meta.get("load_before"),
           "load_after": meta.get("load_after"),
           "faults_due": sum(1 for i in range(len(specs)) if (i + 1) * args.fault_every < wall),
           "faults": len(fired), "fired": [f"{f['spec']} at step {f['step']}" for f in fired],
           "in_process_recoveries": len(re.findall(r"^dslaunch: recovered in process", stderr, re.M)),
           "restarts": len(re.findall(r"^dslaunch: restarting", stderr, re.M)),
           "fallbacks": re.findall(r"^dslaunch: in-process recovery failed \((.*?)\): restarting", stderr, re.M),
           "final_step": max((int(m) for m in re.findall(r"\] DONE 0 (\d+)", stdout)), default=None),
           # the launcher's own figure (productive step time / wall time, startup included)
           "launcher_goodput": next(iter(re.findall(r"^dslaunch: goodput ([\d.]+):", stderr, re.M)), None)}
    if meta["rc"] != 0:
        res["launcher_tail"] = stderr.splitlines()[-6:]
    res["incidents"] = [incident_row(r) for r in recs]
    attach_faults(res["incidents"], recs, fired)
    res["paths"] = [r.get("action") for r in recs]  # in-process, or restart (and why)
    res["steps_redone_total"] = sum(r.get("steps_redone") or 0 for r in recs)
    return res


def runs_from_logs(root: Path, args) -> list:
    """--e-from-logs: the runs of an earlier part e, from the directories --keep-logs left (each
    with run.json: recover, specs, rc, wall_s), oldest first."""
    runs = []
    for keep in sorted(p for p in root.iterdir() if (p / "run.json").exists()):
        meta = json.loads((keep / "run.json").read_text())
        res = run_result(meta, (keep / "stdout.txt").read_text(), (keep / "stderr.txt").read_text(),
                         incidents_of(keep / "logs"), args)
        res["logs_kept"] = keep.name
        if meta.get("note"):
            res["note"] = meta["note"]
        runs.append(res)
    return runs


def e_summary(runs: list) -> dict:
    """Per path: the median wall, goodput against the median fault-free wall (same steps), and
    every fault's seconds to training with its split, over the runs."""
    clean_wall = bu.median([r["wall_s"] for r in runs if r["recover"] is None])
    out = {}
    for path in ("in-process", "restart"):
        rs = [r for r in runs if r["recover"] == path]
        if not rs:
            continue
        incs = [i for r in rs for i in r["incidents"]]
        out[path] = {"wall_s": bu.median([r["wall_s"] for r in rs]),
                     "goodput": bu.ratio(clean_wall, bu.median([r["wall_s"] for r in rs])),
                     "faults_fired": [r["faults"] for r in rs], "faults_due": [r["faults_due"] for r in rs],
                     "in_process_recoveries": [r["in_process_recoveries"] for r in rs],
                     "restarts": [r["restarts"] for r in rs],
                     "steps_redone": [r["steps_redone_total"] for r in rs],
                     "seconds_to_training_median": bu.median([i["seconds_to_training"] for i in incs]),
                     "seconds_to_training_max": max((i["seconds_to_training"] or 0 for i in incs), default=None),
                     "fault_to_training_s": [i.get("fault_to_training_s") for i in incs],
                     "split_median": {label: bu.median([i["split"][label] for i in incs])
                                      for label, _ in PHASE_KEYS}}
    return {"clean_wall_s": clean_wall, **out}


def part_e(args, features) -> dict:
    if "--recover" not in features:
        return {"status": "not run: this dslaunch has no --recover"}
    work = Path(tempfile.mkdtemp(prefix="bench-inprocess-"))
    try:
        runs = runs_from_logs(args.e_from_logs, args) if args.e_from_logs else []
        order = [None, "in-process", "restart"]
        wanted = [None if r == "clean" else r for r in args.e_runs.split(",") if r]
        for i in range(0 if args.e_from_logs else args.repeats):
            for recover in order[i % 3:] + order[:i % 3]:  # each repeat starts one further on
                if recover not in wanted:
                    continue
                bu.log(f"(e) {args.e_steps} steps, {recover or 'no faults'} #{i + 1}")
                runs.append(recover_run(work, args, recover, tag=f"-{i}"))
                r = runs[-1]
                bu.log(f"    wall {r['wall_s']:.0f} s, {r['faults']} faults, {r['in_process_recoveries']} "
                       f"in process, {r['restarts']} restarts")
        summary = e_summary(runs)
        return {"status": "ok", "steps": args.e_steps, "ranks": args.ranks,
                "zero_stage": args.e_zero, "fault_kinds": args.e_kinds, "hang_timeout_s": args.hang_timeout,
                "fault_every_s": args.fault_every, "step_sleep_s": args.step_sleep,
                "schedule": "at= (job wall time, once per job): one fault every --fault-every s, kinds in turn",
                "goodput_in_process": summary.get("in-process", {}).get("goodput"),
                "goodput_restart": summary.get("restart", {}).get("goodput"),
                "target": "in-process >= 0.95 at a fault every 120 s, >= 0.85 every 40 s",
                "summary": summary, "runs": clean(runs, {str(work): "<work>"})}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- (c), (d): the other helpers' benchmarks ------------------------------------------------------
SMOKE_ARGS = {"bench_watchdog_cost": ["--smoke"], "bench_async_checkpoint": ["--saves", "1"]}


def other_bench(name: str, args) -> dict:
    path = HERE / f"{name}.py"
    if not path.exists():
        return {"status": "not run", "why": f"benchmarks/{name}.py is not there"}
    argv = [PY, str(path), *(SMOKE_ARGS.get(name, []) if args.smoke else [])]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=3600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        return {"status": "ok" if r.returncode == 0 else f"exit {r.returncode}", "result": json.loads(r.stdout)}
    except ValueError:
        return {"status": f"exit {r.returncode}", "stderr_tail": r.stderr.splitlines()[-8:]}


def command(argv: list) -> str:
    """How it was run, without where its file went (--results-dir: a path of this machine)."""
    shown, skip = [], False
    for word in argv:
        if skip or word.startswith("--results-dir"):
            skip = word == "--results-dir"
            continue
        if word.startswith(("--keep-logs=", "--e-from-logs=")):
            word = word.split("=")[0] + "=<dir>"
        shown.append("<dir>" if shown and shown[-1] in ("--keep-logs", "--e-from-logs") else word)
    return shlex.join(["benchmarks/bench_resilience.py", *shown])


def main(argv=None):
    args = parse_args(argv)
    features = launcher_features()
    result = {"kind": "resilience", "when": bu.now_iso(), "machine": bu.machine(), "git": bu.git_rev(),
              "command": command(sys.argv[1:] if argv is None else argv),
              "load_before": bu.loadavg(), "launcher_features": sorted(features),
              "settings": {k: v for k, v in vars(args).items() if k != "results_dir"}}
    result["settings"]["results_dir"] = None
    for key in ("keep_logs", "e_from_logs"):  # paths of this machine
        result["settings"][key] = None if getattr(args, key) is None else "<kept>"
    steps = {"a": ("recovery", lambda: part_a(args, features)), "b": ("goodput", lambda: part_b(args, features)),
             "e": ("in_process", lambda: part_e(args, features)),
             "c": ("async_checkpoint", lambda: other_bench("bench_async_checkpoint", args)),
             "d": ("watchdog_cost", lambda: other_bench("bench_watchdog_cost", args))}
    for part, (key, run) in steps.items():
        result[key] = run() if part in args.part_list else {"status": "not run", "why": "not in --parts"}
    result["load_after"] = bu.loadavg()
    result = clean(result, {str(REPO): "<repo>", str(Path(PY).parent.parent): "<venv>"})
    print(json.dumps(result, indent=1))
    if not args.no_save:
        path = bu.save_json(result, "resilience", args.results_dir)
        bu.log(f"saved {path}")


if __name__ == "__main__":
    main()
