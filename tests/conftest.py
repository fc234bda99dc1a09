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
"""

from __future__ import annotations

import pytest

from helpers import JobCache

_CACHES: list = []


@pytest.fixture(scope="session")
def job_cache(tmp_path_factory) -> JobCache:
    cache = JobCache(tmp_path_factory.mktemp("jobs"))
    _CACHES.append(cache)
    return cache


def pytest_terminal_summary(terminalreporter):
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
