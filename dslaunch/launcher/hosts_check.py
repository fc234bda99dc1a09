"""Probe hosts in parallel: reachable, Python / torch / dslaunch versions, accelerators, free memory
and disk, master port free, clock offset. Used by ``dslaunch hosts check`` and the preflight of
``dslaunch run``.

Each host runs a small constant Python program (``PROBE``) through the runner's transport (the
runner's ``probe_transport``: ssh by default, srun under SLURM, ``sh -c`` on this host for the
local launcher); its arguments travel as one base64 JSON word, so nothing the user typed
is parsed by a remote shell. torch's version is read from the package metadata (no import: fast,
and a host without torch still answers).
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

MARK = "@@dslaunch-probe "
CLOCK_WARN = 2.0  # seconds of clock offset worth flagging (logs and timeouts get confusing)

PROBE = r"""
import base64, json, os, shutil, socket, sys, time
a = json.loads(base64.urlsafe_b64decode(sys.argv[1]))
o = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
     "hostname": socket.gethostname()}
try:
    from importlib import metadata as md
except ImportError:
    md = None
def ver(n):
    try:
        return md.version(n)
    except Exception:
        return None
try:
    import dslaunch
    o["dslaunch"] = getattr(dslaunch, "__version__", None) or ver("dslaunch") or "?"
except Exception as e:
    o["dslaunch"] = None
    o["dslaunch_error"] = "%s: %s" % (type(e).__name__, e)
o["torch"] = ver("torch")
try:
    o["gpus"] = len(os.listdir("/proc/driver/nvidia/gpus"))
except OSError:
    o["gpus"] = 0
try:
    with open("/proc/meminfo") as f:
        m = dict(l.split(":", 1) for l in f if ":" in l)
    o["mem_free"] = int(m["MemAvailable"].split()[0]) * 1024
except Exception:
    o["mem_free"] = None
cwd = a.get("cwd")
o["cwd_ok"] = os.path.isdir(cwd) if cwd else None
try:
    o["disk_free"] = shutil.disk_usage(cwd if o["cwd_ok"] else os.path.expanduser("~")).free
except OSError:
    o["disk_free"] = None
if a.get("script"):
    p = a["script"] if os.path.isabs(a["script"]) else os.path.join(cwd or ".", a["script"])
    o["script_ok"] = os.path.isfile(p)
if a.get("port"):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", a["port"]))
        o["port_free"] = True
    except OSError:
        o["port_free"] = False
    finally:
        s.close()
o["time"] = time.time()
sys.stdout.write("@@dslaunch-probe " + json.dumps(o) + "\n")
"""


def local_versions() -> dict:
    def ver(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    import dslaunch

    return {"python": "%d.%d.%d" % sys.version_info[:3], "torch": ver("torch"),
            "dslaunch": dslaunch.__version__}


def probe_command(python: str, args: dict) -> str:
    """The remote shell command that runs the probe (every word quoted)."""
    b64 = base64.urlsafe_b64encode(json.dumps(args).encode()).decode("ascii")
    return "exec " + shlex.join([python, "-c", PROBE, b64])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def probe_host(host: str, argv: list, timeout: float) -> dict:
    """Run one probe command (``argv``: the transport + remote command) and classify the answer."""
    r = {"host": host, "status": "ok", "reason": ""}
    t0 = time.time()
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return {**r, "status": "down", "reason": f"no answer within {timeout:g} s"}
    except OSError as exc:
        return {**r, "status": "error", "reason": f"cannot run {argv[0]}: {exc.strerror}"}
    t1 = time.time()
    r["elapsed"] = round(t1 - t0, 3)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    line = next((ln for ln in out.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        msg = _last_line(err) or _last_line(out) or f"exit code {proc.returncode}"
        if proc.returncode == 255 and argv[0] == "ssh":
            return {**r, "status": "down", "reason": f"ssh failed: {msg}"}
        if proc.returncode in (126, 127) or "No such file" in msg or "not found" in msg:
            return {**r, "status": "no-python", "reason": f"interpreter not usable: {msg}"}
        return {**r, "status": "error", "reason": msg}
    try:
        info = json.loads(line[len(MARK):])
    except ValueError:
        return {**r, "status": "error", "reason": "unreadable probe answer"}
    r.update(info)
    # The probe prints its clock last; the way back is one pipe + one network hop.
    r["clock_offset"] = round(info["time"] - t1, 3)
    return r


def judge(results: list, local: dict, need_script: bool = False, need_cwd: bool = False) -> list:
    """Mark each reachable host's problems (versions that differ from this host, missing parts)."""
    for r in results:
        if r["status"] != "ok":
            continue
        problems = []
        if r.get("dslaunch") is None:
            r["status"] = "no-dslaunch"
            problems.append(f"dslaunch not importable by {r.get('executable')} "
                            f"({r.get('dslaunch_error', '?')})")
        for key in ("python", "torch", "dslaunch"):
            if r.get(key) is not None and local.get(key) is not None and r[key] != local[key]:
                problems.append(f"{key} {r[key]} (here {local[key]})")
                r["status"] = "mismatch" if r["status"] == "ok" else r["status"]
        if r.get("torch") is None and local.get("torch") is not None:
            problems.append("torch not installed")
            r["status"] = "mismatch" if r["status"] == "ok" else r["status"]
        if need_cwd and r.get("cwd_ok") is False:
            problems.append("working directory missing")
            r["status"] = "missing" if r["status"] == "ok" else r["status"]
        if need_script and r.get("script_ok") is False:
            problems.append("script missing")
            r["status"] = "missing" if r["status"] == "ok" else r["status"]
        if r.get("port_free") is False:
            problems.append("master port in use")
            r["status"] = "port-busy" if r["status"] == "ok" else r["status"]
        if abs(r.get("clock_offset") or 0) > CLOCK_WARN:
            r["warning"] = f"clock off by {r['clock_offset']:+.1f} s"
        r["reason"] = "; ".join(problems)
    return results


def check_hosts(hosts: list, transport, python: str, timeout: float = 10.0, port: int | None = None,
                cwd: str | None = None, script: str | None = None, via: str | None = None) -> list:
    """Probe ``hosts`` in parallel. ``transport(host, remote_command, timeout) -> argv`` (a
    runner's ``probe_transport``; ``via``, its ``probe_via``, is recorded in each result).
    The port is checked on the first host only (where the rendezvous listens)."""
    def one(i_host):
        i, host = i_host
        args = {"cwd": cwd, "script": script, "port": port if i == 0 else None}
        argv = transport(host, probe_command(python, args), timeout)
        return {**probe_host(host, argv, timeout), "via": via}

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        results = list(pool.map(one, enumerate(hosts)))
    return judge(results, local_versions(), need_script=bool(script), need_cwd=bool(cwd))


def local_transport(host, command, timeout):
    """The probe on this host itself (the local launcher's hosts): the same command through
    ``sh -c``, as srun runs it; nothing is reached over the network."""
    return ["sh", "-c", command]


def ssh_transport(options: dict):
    from dslaunch.launcher.runners import remote

    def transport(host, command, timeout):
        return remote.ssh_argv(host, options, connect_timeout=min(timeout, 10)) + ["--", command]

    return transport


def human_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def table_lines(results: list) -> list:
    """Plain-text table (preflight errors, logs)."""
    from dslaunch.launcher.text_table import text_table

    rows = [("host", "via", "status", "python", "torch", "dslaunch", "reason")]
    for r in results:
        rows.append((r["host"], r.get("via") or "-", r["status"], r.get("python") or "-",
                     r.get("torch") or "-", r.get("dslaunch") or "-",
                     r.get("reason") or r.get("warning") or ""))
    return text_table(rows)
