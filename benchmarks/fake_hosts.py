"""The fake hosts of tests/infra (network namespaces with sshd) for a benchmark, under the
machine-wide lock that the multi-host tests take too (tests/multihost/conftest.py).

    with FakeHosts(4) as hosts:          # waits for the lock; brings host1..host4 up if needed
        hosts.shape("1gbit")             # token bucket on every host's link (cleared on exit)
        ...
        hosts.reap("host1")              # kill what a run left in a host's namespace

Whoever holds the lock owns the namespaces. Only what this object brought up is taken down;
shaping is always cleared. Namespaces found up under the lock were left by someone who did not
take it (an older test run, a crash): they are waited for (they may be in use), or reused with
``reuse=True`` when every host needed is there and none of them is a bare host.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "tests" / "infra"
INFRA_DIR = Path("/run/dslaunch-infra")
LOCK_PATH = "/run/dslaunch-netns.lock"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sh(script: str, *args, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INFRA / script), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def namespaces() -> list:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith("dsl-"))


def daemon_pids(host: str) -> set:
    pids = set()
    for pf in (INFRA_DIR / f"sshd-{host}.pid", Path(f"/run/dslaunch-slurm/slurmd-{host}.pid")):
        try:
            pids.add(int(pf.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def job_pids(host: str) -> list:
    """Processes in the host's namespace other than its daemons."""
    out = subprocess.run(["ip", "netns", "pids", f"dsl-{host}"], capture_output=True, text=True).stdout
    daemons = daemon_pids(host)
    return [int(p) for p in out.split() if int(p) not in daemons]


def reap(host: str) -> int:
    """SIGKILL what a run left in the host's namespace; how many there were."""
    left = job_pids(host)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


class FakeHosts:
    def __init__(self, n: int, reuse: bool = False, wait: float = 3600.0, slurm: bool = False):
        self.n, self.reuse, self.wait, self.want_slurm = n, reuse, wait, slurm
        self.hosts = [f"host{i}" for i in range(1, n + 1)]
        self.lock = None
        self.started = self.started_slurm = self.shaped = False

    # ---- lock ----------------------------------------------------------------------------------
    def _acquire(self) -> None:
        self.lock = open(LOCK_PATH, "a+")
        deadline = time.monotonic() + self.wait
        said = False
        while True:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    self.lock.seek(0)
                    log(f"fake hosts in use (lock {LOCK_PATH}: {self.lock.read().strip()}); waiting")
                    said = True
                if time.monotonic() > deadline:
                    self._release()
                    raise RuntimeError(f"the fake hosts stayed in use (lock {LOCK_PATH}) for {self.wait:g} s") from None
                time.sleep(1)
        self.lock.seek(0)
        self.lock.truncate()
        self.lock.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        self.lock.flush()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None

    # ---- up / down -----------------------------------------------------------------------------
    def _usable_as_is(self) -> bool:
        have = namespaces()
        if any(f"dsl-{h}" not in have for h in self.hosts):
            return False
        for h in self.hosts:  # a bare host (dslaunch hidden) cannot run the job
            try:
                if (INFRA_DIR / f"bare-{h}").read_text().strip():
                    return False
            except OSError:
                return False
        return True

    def __enter__(self) -> "FakeHosts":
        self._acquire()
        try:
            if namespaces():
                if self.reuse and self._usable_as_is():
                    log(f"reusing the fake hosts that are up: {' '.join(namespaces())}")
                else:
                    self._wait_gone()
            if not namespaces():
                r = sh("netns_up.sh", env={"DSL_NODES": str(self.n), "DSL_INSTALL_PDSH": "0"})
                if r.returncode != 0:
                    sh("netns_down.sh")
                    raise RuntimeError(f"fake hosts did not come up:\n{r.stdout}\n{r.stderr}")
                self.started = True
            if self.want_slurm and not Path("/run/dslaunch-slurm").exists():
                r = sh("slurm_up.sh", env={"DSL_SLURM_MODE": "netns"})
                self.started_slurm = r.returncode == 0
                if not self.started_slurm:
                    log(f"slurm did not come up: {r.stderr[-300:]}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_gone(self) -> None:
        log("fake hosts are up but were not brought up under the lock (an older test run may be "
            f"using them): waiting up to {self.wait:g} s for them to go (--reuse-hosts to use them)")
        deadline = time.monotonic() + self.wait
        while namespaces():
            if time.monotonic() > deadline:
                raise RuntimeError("fake hosts from someone else stayed up; if nobody uses them, "
                                   "remove them with tests/infra/netns_down.sh")
            time.sleep(2)

    def __exit__(self, *exc) -> None:
        try:
            if self.shaped:
                self.clear_shaping()
            if self.started_slurm:
                sh("slurm_down.sh")
            if self.started:
                sh("netns_down.sh")
        finally:
            self.started = self.started_slurm = False
            self._release()

    # ---- link shaping --------------------------------------------------------------------------
    def shape(self, rate: str) -> str:
        """Token bucket of ``rate`` (tc syntax, e.g. 1gbit) on every host's egress; tc's view."""
        self.shaped = True
        r = sh("netns_shape.sh", rate, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"netns_shape.sh {rate} failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def clear_shaping(self) -> None:
        sh("netns_shape.sh", "clear", timeout=60)
        self.shaped = False

    reap = staticmethod(reap)
    job_pids = staticmethod(job_pids)
