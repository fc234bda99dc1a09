"""Fake hosts for the multi-host tests: network namespaces with their own sshd (tests/infra/).

Session fixtures:
- ``cluster``: host1, host2 (healthy) and host3 (python present, dslaunch/torch hidden by a tmpfs
  over the venv's site-packages in host3's own mount namespace), and host4 (healthy: the third
  host of elastic jobs, or their spare; the other tests leave it out of their hostfiles). Brought up once, torn down at
  the end. Skips ONLY when not root or ``ip netns`` is unusable; missing packages are a failure
  (run .ci/apt-install.sh), so CI cannot silently skip.
- ``slurm``: slurmctld + one slurmd per fake host (munge), started on first use.

All fake hosts share this filesystem, so the remote interpreter is this venv's python.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "tests" / "infra"
INFRA_DIR = Path("/run/dslaunch-infra")
SLURM_DIR = Path("/run/dslaunch-slurm")
HOSTS = ["host1", "host2"]
BARE = "host3"
EXTRA = "host4"
DOWN_ADDR = "198.51.100.99"  # in the fake subnet, owned by nobody: connect fails (no ARP answer)
DSLAUNCH = [sys.executable, "-c", "from dslaunch.cli import main; main()"]
_PLAN_RE = re.compile(r"--plan[ =]([A-Za-z0-9_=-]+)")


def _sh(script: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INFRA / script)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _daemon_pids(host: str) -> set:
    pids = set()
    for pf in (INFRA_DIR / f"sshd-{host}.pid", SLURM_DIR / f"slurmd-{host}.pid"):
        try:
            pids.add(int(pf.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def _describe(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"{pid} {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return f"{pid} (gone)"


class Cluster:
    hosts = HOSTS
    bare = BARE
    extra = EXTRA
    down_addr = DOWN_ADDR

    def hostfile(self, path: Path, entries: dict | None = None) -> Path:
        entries = entries or {h: 2 for h in HOSTS}
        path.write_text("".join(f"{h} slots={n}\n" for h, n in entries.items()))
        return path

    def dslaunch(self, *args, cwd: Path, env: dict | None = None, timeout: float = 120,
                 prefix: list | None = None) -> subprocess.CompletedProcess:
        """Run the real CLI (as a user would), return its output."""
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([*(prefix or []), *DSLAUNCH, *args], cwd=cwd, env=full_env,
                              capture_output=True, text=True, timeout=timeout)

    # ---- processes -----------------------------------------------------------------------------
    def ns_pids(self, host: str) -> list:
        out = subprocess.run(["ip", "netns", "pids", f"dsl-{host}"], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def job_pids(self, host: str) -> list:
        """Every process in the host's namespace except its daemons (sshd listener, slurmd)."""
        daemons = _daemon_pids(host)
        alive = []
        for p in self.ns_pids(host):
            if p in daemons:
                continue
            try:
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:  # exited meanwhile
                pass
        return alive

    def local_job_pids(self, cwd: Path) -> list:
        """Processes on the launching host that carry a plan of a job run in ``cwd`` (agents,
        ssh/pdsh/mpirun/srun clients)."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            for m in _PLAN_RE.finditer(" ".join(p.info["cmdline"] or [])):
                try:
                    plan = json.loads(base64.urlsafe_b64decode(m.group(1)))
                except ValueError:
                    continue
                if str(plan.get("cwd", "")).startswith(str(cwd)):
                    found.append(p.info["pid"])
        return found

    def assert_clean(self, cwd: Path, hosts=None, wait: float = 15.0) -> None:
        """No process of the job on any fake host nor here (waits for in-flight exits)."""
        hosts = hosts or [*HOSTS, BARE, EXTRA]
        deadline = time.monotonic() + wait
        while True:
            left = {h: self.job_pids(h) for h in hosts}
            left = {h: p for h, p in left.items() if p}
            local = self.local_job_pids(cwd)
            if not left and not local:
                return
            if time.monotonic() > deadline:
                lines = [f"{h}: " + "; ".join(_describe(p) for p in ps) for h, ps in left.items()]
                if local:
                    lines.append("launching host: " + "; ".join(_describe(p) for p in local))
                pytest.fail("processes left behind:\n" + "\n".join(lines))
            time.sleep(0.2)

    # ---- host loss -----------------------------------------------------------------------------
    def host_down(self, host: str) -> None:
        r = subprocess.run(["bash", str(INFRA / "netns_host.sh"), "down", host], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr

    def host_up(self, host: str) -> None:
        r = subprocess.run(["bash", str(INFRA / "netns_host.sh"), "up", host], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr


def _namespaces_usable() -> str | None:
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, sshd on port 22)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns` is not usable here: {r.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def cluster():
    why = _namespaces_usable()
    if why:
        pytest.skip(why)
    missing = [b for b in ("ssh", "pdsh") if shutil.which(b) is None]
    if not os.path.exists("/usr/sbin/sshd"):
        missing.append("sshd")
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run .ci/apt-install.sh")
    _sh("slurm_down.sh")
    _sh("netns_down.sh")
    site = sysconfig.get_paths()["purelib"]
    up = _sh("netns_up.sh", env={"DSL_NODES": "4", "DSL_BARE_HOSTS": BARE, "DSL_HIDE_PATH": site,
                                  "DSL_INSTALL_PDSH": "0"})
    if up.returncode != 0:
        _sh("netns_down.sh")
        pytest.fail(f"fake hosts did not come up:\n{up.stdout}\n{up.stderr}")
    try:
        yield Cluster()
    finally:
        _sh("slurm_down.sh")
        _sh("netns_down.sh")


@pytest.fixture(scope="session")
def slurm(cluster):
    for b in ("slurmctld", "slurmd", "munged", "srun", "sbatch"):
        if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}"):
            pytest.fail(f"{b} missing: run .ci/apt-install.sh")
    up = _sh("slurm_up.sh", env={"DSL_SLURM_MODE": "netns"})
    if up.returncode != 0:
        _sh("slurm_down.sh")
        pytest.fail(f"SLURM did not come up:\n{up.stdout}\n{up.stderr}")
    yield cluster
    _sh("slurm_down.sh")


@pytest.fixture
def jobdir(tmp_path):
    """A working directory for one job, with the test scripts copied in."""
    d = tmp_path / "job"
    d.mkdir()
    for f in (Path(__file__).parent / "scripts").iterdir():
        if f.suffix == ".py":
            shutil.copy(f, d / f.name)
    return d
