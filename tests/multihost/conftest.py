"""Fake hosts for the multi-host tests: network namespaces with their own sshd (tests/infra/).

Fixtures (the hosts are brought up once, on first use, under a machine-wide lock, and torn down
when the run leaves this directory):
- ``cluster``: host1, host2 (healthy) and host3 (python present, dslaunch/torch hidden by a tmpfs
  over the venv's site-packages in host3's own mount namespace), and host4 (healthy: the third
  host of elastic jobs, or their spare; the other tests leave it out of their hostfiles). Skips
  ONLY when not root or ``ip netns`` is unusable; missing packages are a failure (run
  .ci/apt-install.sh), so CI cannot silently skip.
- ``slurm``: slurmctld + one slurmd per fake host (munge), started on first use.

All fake hosts share this filesystem, so the remote interpreter is this venv's python.
"""

from __future__ import annotations

import base64
import fcntl
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
# One owner of the fake hosts per machine: other pytest runs and benchmarks take the same lock.
LOCK_PATH = "/run/dslaunch-netns.lock"
LOCK_WAIT = 3600.0
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

    def split(self, host: str, heal: bool = False) -> None:
        """Cut ``host``'s link (``heal``: restore it); its processes live on."""
        r = subprocess.run(["bash", str(INFRA / "netns_host.sh"), "heal" if heal else "split",
                            host], capture_output=True, text=True, timeout=30)
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


class _FakeHosts:
    """The fake hosts (and SLURM on them), brought up on first use and torn down when the run
    leaves this directory (not at the session's end), under a machine-wide lock: one pytest run
    (or benchmark) owns the namespaces at a time, and another waits rather than tearing them down
    under it."""

    def __init__(self):
        self.lock = None
        self.up = False
        self.slurm = False

    def acquire(self) -> None:
        if self.lock is not None:
            return
        self.lock = open(LOCK_PATH, "a+")
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.lock.seek(0)
                    holder = self.lock.read().strip()
                    self.lock.close()
                    self.lock = None
                    pytest.fail(f"the fake hosts are in use (lock {LOCK_PATH}, held by {holder}) "
                                f"for more than {LOCK_WAIT:g} s")
                time.sleep(1)
        self.lock.seek(0)
        self.lock.truncate()
        self.lock.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        self.lock.flush()

    def ensure_up(self) -> None:
        if self.up:
            return
        self.acquire()
        _sh("slurm_down.sh")
        _sh("netns_down.sh")
        site = sysconfig.get_paths()["purelib"]
        up = _sh("netns_up.sh", env={"DSL_NODES": "4", "DSL_BARE_HOSTS": BARE, "DSL_HIDE_PATH": site,
                                      "DSL_INSTALL_PDSH": "0"})
        if up.returncode != 0:
            self.down()
            pytest.fail(f"fake hosts did not come up:\n{up.stdout}\n{up.stderr}")
        self.up = True

    def ensure_slurm(self) -> None:
        if self.slurm:
            return
        up = _sh("slurm_up.sh", env={"DSL_SLURM_MODE": "netns"})
        if up.returncode != 0:
            _sh("slurm_down.sh")
            pytest.fail(f"SLURM did not come up:\n{up.stdout}\n{up.stderr}")
        self.slurm = True

    def down(self) -> None:
        if self.up or self.slurm:
            _sh("slurm_down.sh")
            _sh("netns_down.sh")
        self.up = self.slurm = False
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None


FAKE_HOSTS = _FakeHosts()
HERE = Path(__file__).resolve().parent


def pytest_runtest_teardown(item, nextitem):
    # Leaving this directory: give the namespaces back now, not at the end of a long run.
    if nextitem is None or HERE not in Path(str(nextitem.path)).resolve().parents:
        FAKE_HOSTS.down()


def pytest_sessionfinish(session, exitstatus):
    FAKE_HOSTS.down()


@pytest.fixture
def cluster():
    why = _namespaces_usable()
    if why:
        pytest.skip(why)
    missing = [b for b in ("ssh", "pdsh") if shutil.which(b) is None]
    if not os.path.exists("/usr/sbin/sshd"):
        missing.append("sshd")
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run .ci/apt-install.sh")
    FAKE_HOSTS.ensure_up()
    return Cluster()


@pytest.fixture
def slurm(cluster):
    for b in ("slurmctld", "slurmd", "munged", "srun", "sbatch"):
        if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}"):
            pytest.fail(f"{b} missing: run .ci/apt-install.sh")
    FAKE_HOSTS.ensure_slurm()
    return cluster


@pytest.fixture
def jobdir(tmp_path):
    """A working directory for one job, with the test scripts copied in."""
    d = tmp_path / "job"
    d.mkdir()
    for f in (Path(__file__).parent / "scripts").iterdir():
        if f.suffix == ".py":
            shutil.copy(f, d / f.name)
    return d
