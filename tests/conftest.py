"""Fixtures shared by every test file (tests/multihost/ adds its own on top).

- ``job_cache`` (session): the one cache of expensive multi-process jobs (helpers.JobCache).
  Ask it for a job by what the job does; every test in the session that asks for the same job,
  in this file or another, gets the same finished Job, and each job runs at most once:

      def test_stage2_trains(job_cache):
          job = job_cache.run("s2", "zero_train.py", "--steps", 20, "--out", "{dir}/out.json",
                              config={"train_batch_size": 16, ...}, nproc=2)
          assert job.json()["losses"][19] < job.json()["losses"][0]

  The summary line at the end of a run says how many jobs ran and how many requests were
  served from the cache.

Plain helpers (ROOT, SCRIPTS, ``dslaunch``, ``launch``, ``run_python``, ``results``) are imported
from tests/helpers.py: see its docstring for why they are not defined here.

Parallel runs (pytest-xdist, ``make test``: ``-n N --dist loadfile``):
- each test file runs whole on one worker, and tests/multihost/ as ONE unit: its fake hosts
  (namespaces ``dsl-host1..4``, their fixed addresses, /etc/hosts, sshd, SLURM) exist once per
  machine, under a machine-wide lock (tests/multihost/conftest.py);
- the workers share one job cache (``job_cache``'s directory and a lock per job): a job that
  tests of two files ask for runs once in the whole run, and the other worker waits for it;
- ``-x``: the first failure stops every worker after the test it is running (not after the
  files already queued to it), and ``-rfE`` names that test again at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import JobCache

_CACHES: list = []


def _run_dir(config) -> Path | None:
    """The directory the controller and the workers of an xdist run share (None: no xdist)."""
    shared = getattr(config, "workerinput", {}).get("dsl_run_dir")
    return Path(shared) if shared else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist controller) tell each worker the run's shared directory."""
    node.workerinput["dsl_run_dir"] = str(node.config._tmp_path_factory.getbasetemp())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with every file of tests/multihost/ in one unit (see above)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndFakeHosts(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return str(Path(path).parent) if Path(path).parent.name == "multihost" else path

        def _assign_work_unit(self, node):
            # the fake hosts' unit first: the longest one (its jobs mostly wait on timeouts,
            # sshd and SLURM), so the files of the other workers fill the time around it
            for scope in self.workqueue:
                if Path(scope).name == "multihost":
                    self.workqueue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

    return FilesAndFakeHosts(config, log)


class _StopAllWorkers:
    """(xdist controller) ``-x``: at the first failure, leave a ``stop`` file in the run's shared
    directory; each worker ends its session when it sees it after a test (below). Without this
    xdist stops a worker only after every file already queued to it."""

    def __init__(self, config):
        self.config, self.failures = config, 0

    def pytest_runtest_logreport(self, report):
        if not report.failed or not self.config.pluginmanager.hasplugin("dsession"):
            return
        self.failures += 1
        maxfail = self.config.getoption("maxfail")
        if maxfail and self.failures >= maxfail:
            (self.config._tmp_path_factory.getbasetemp() / "stop").touch()


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_StopAllWorkers(config), "dslaunch-stop-all-workers")


def pytest_runtest_teardown(item):
    run_dir = _run_dir(item.config)
    if run_dir is not None and (run_dir / "stop").exists():  # another worker failed (-x)
        item.session.shouldstop = "another worker failed (-x)"


@pytest.fixture(scope="session")
def job_cache(request, tmp_path_factory) -> JobCache:
    run_dir = _run_dir(request.config)
    cache = JobCache(run_dir / "jobs" if run_dir else tmp_path_factory.mktemp("jobs"))
    cache.root.mkdir(parents=True, exist_ok=True)
    _CACHES.append(cache)
    return cache


def pytest_sessionfinish(session):
    run_dir = _run_dir(session.config)
    if run_dir is not None and _CACHES:  # (xdist worker) its reuses, for the summary line
        (run_dir / "jobs" / f".hits-{os.getpid()}").write_text(str(_CACHES[0].hits))


def pytest_terminal_summary(terminalreporter, config):
    if config.pluginmanager.hasplugin("dsession"):  # xdist controller: every worker's jobs
        jobs = config._tmp_path_factory.getbasetemp() / "jobs"
        ran = JobCache.records(jobs) if jobs.is_dir() else []
        hits = sum(int(p.read_text()) for p in jobs.glob(".hits-*")) if ran else 0
        if ran:
            terminalreporter.write_line(JobCache.summary_of(ran, hits))
    for cache in _CACHES:
        if cache.jobs:
            terminalreporter.write_line(cache.summary())


@pytest.fixture
def world_of_one(tmp_path):
    """A one-rank gloo world for in-process tests (the one an earlier in-process test left, else
    a new one, destroyed after); MoE expert groups made in it are forgotten before and after."""
    import torch.distributed as dist

    from dslaunch.engine.parallel import expert_groups

    expert_groups.reset()
    if dist.is_initialized():  # an earlier in-process engine test's world of one: reuse it
        assert dist.get_world_size() == 1
        yield
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1)
        yield
        dist.destroy_process_group()
    expert_groups.reset()
