"""The shared test machinery itself (tests/helpers.py, tests/conftest.py): the job cache runs a
job once per description, whatever it is called, keeps failures, and fills in ``{dir}``.
Plain single-process jobs of a tiny script (no torch), well under a second."""

import json
import subprocess
import sys

import pytest

from helpers import ROOT, JobCache, _fill

SCRIPT = """
import json, pathlib, sys
log, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with log.open("a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
if sys.argv[3] == "fail":
    sys.exit("planned failure")
out.write_text(json.dumps({"arg": sys.argv[3], "losses": {"0": 1.5, "1": 1.25}}))
"""


@pytest.fixture
def cache(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    return JobCache(tmp_path / "jobs"), tmp_path / "script.py", tmp_path / "log"


def test_the_same_job_runs_once_whatever_its_name(cache):
    jobs, script, log = cache
    a = jobs.python("first", script, log, "{dir}/out.json", "x")
    b = jobs.python("second", script, log, "{dir}/out.json", "x")
    assert a is b and jobs.hits == 1
    assert log.read_text().splitlines() == [f"{a.dir}/out.json x"]  # {dir} filled in, one run
    assert a.dir.name.startswith("first-")
    res = a.json()
    assert res == {"arg": "x", "losses": {0: 1.5, 1: 1.25}}  # step keys back to ints
    res["arg"] = "changed"
    assert a.json()["arg"] == "x"  # each call a fresh copy


def test_another_description_is_another_job(cache):
    jobs, script, log = cache
    a = jobs.python("j", script, log, "{dir}/out.json", "x")
    b = jobs.python("j", script, log, "{dir}/out.json", "y")
    assert a is not b and a.dir != b.dir and jobs.hits == 0
    assert len(log.read_text().splitlines()) == 2


def test_a_failed_job_is_kept_and_fails_every_asker(cache):
    jobs, script, log = cache
    for _ in range(2):
        with pytest.raises(AssertionError, match="planned failure"):
            jobs.python("bad", script, log, "{dir}/out.json", "fail")
    assert len(log.read_text().splitlines()) == 1
    job = jobs.python("bad", script, log, "{dir}/out.json", "fail", check=False)
    assert not job.ok and job.proc.returncode != 0
    assert "1 jobs run" in jobs.summary() and "failed: bad" in jobs.summary()


def test_processes_sharing_a_root_run_each_job_once(cache):
    # the pytest-xdist workers of one run: two at once ask for the same job, the second waits
    # for the first's lock, then finds its record; a third cache (this process) finds it too
    jobs, script, log = cache
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from helpers import JobCache; "
            "job = JobCache(sys.argv[2]).python('w', sys.argv[3], sys.argv[4], '{dir}/out.json', "
            "'x'); print(job.dir, job.json()['arg'])")
    procs = [subprocess.Popen([sys.executable, "-c", code, ROOT / "tests", jobs.root, script, log],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len(log.read_text().splitlines()) == 1  # ran once
    assert outs[0][0] == outs[1][0] and outs[0][0].endswith(" x\n")  # the same job's dir
    job = jobs.python("other-name", script, log, "{dir}/out.json", "x")
    assert str(job.dir) == outs[0][0].split()[0] and job.json()["arg"] == "x"
    assert len(log.read_text().splitlines()) == 1 and jobs.hits == 1
    assert jobs.summary().startswith("job_cache: 0 jobs run")  # it ran none itself
    assert [(name, ok) for name, _, ok in JobCache.records(jobs.root)] == [("w", True)]


def test_many_runs_found_in_another_process_cache_are_not_run_again(cache):
    jobs, script, log = cache
    for arg in "ab":
        jobs.python(arg, script, log, "{dir}/out.json", arg)
    other = JobCache(jobs.root)  # another worker of the same run: finds both, starts nothing
    other.python_many("again", script, {"a": (log, "{dir}/out.json", "a"),
                                        "b": (log, "{dir}/out.json", "b")})
    assert other.python("a", script, log, "{dir}/out.json", "a").json()["arg"] == "a"
    assert len(log.read_text().splitlines()) == 2 and other.summary().startswith("job_cache: 0 jobs")


def test_dir_is_filled_in_configs_too():
    cfg = {"zero_optimization": {"offload_optimizer": {"nvme_path": "{dir}/swap"}},
           "steps": 3, "list": ["{dir}", 1]}
    assert _fill(cfg, "/d") == {"zero_optimization": {"offload_optimizer": {"nvme_path": "/d/swap"}},
                                "steps": 3, "list": ["/d", 1]}
    assert json.dumps(cfg).count("{dir}") == 2  # the description (the key) is left as it was


def test_job_cache_fixture_is_the_session_cache(job_cache):
    assert isinstance(job_cache, JobCache) and job_cache.root.is_dir()


def test_no_two_test_files_share_a_name():
    # pytest imports test files by basename (rootdir-relative, no packages): two files named
    # alike in different folders stop the whole run at collection.
    from collections import Counter

    from helpers import ROOT

    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]
