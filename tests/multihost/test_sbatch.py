"""`dslaunch sbatch`: --dry-run prints the batch script and submits nothing; without it a real job
is submitted to the fake cluster's slurmctld and its output shows every rank on both nodes."""

from __future__ import annotations

import subprocess
import time

import pytest
from test_runners import ENV_FILE, HOSTILE_ARGS, HOSTILE_ENV, check_job

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _jobs() -> list:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


def test_sbatch_dry_run_submits_nothing(slurm, jobdir):
    before = _jobs()
    res = slurm.dslaunch("sbatch", "-N", "2", "--ntasks-per-node", "2", "--dry-run", "--",
                         "--env", f"DSL_T_VAR={HOSTILE_ENV}", "report.py", *HOSTILE_ARGS, cwd=jobdir)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=dslaunch\n#SBATCH --nodes=2\n")
    assert "run --launcher slurm" in res.stdout
    assert _jobs() == before


def test_sbatch_rejects_unsafe_directive(slurm, jobdir):
    res = slurm.dslaunch("sbatch", "-J", "my job", "--dry-run", "report.py", cwd=jobdir)
    assert res.returncode == 2 and "--job-name 'my job'" in res.stderr


def test_sbatch_submits_a_real_job(slurm, jobdir):
    (jobdir / ".dslaunch_env").write_text(ENV_FILE)
    res = slurm.dslaunch("sbatch", "-N", "2", "--ntasks-per-node", "2", "-w", "host1,host2",
                         "-o", str(jobdir / "out-%j.txt"), "--",
                         "--env", f"DSL_T_VAR={HOSTILE_ENV}", "report.py", *HOSTILE_ARGS, cwd=jobdir)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split("submitted batch job ")[1].split()[0]
    deadline = time.monotonic() + 150
    while job_id in _jobs():
        assert time.monotonic() < deadline, f"job {job_id} still queued/running"
        time.sleep(0.5)
    state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    out = (jobdir / f"out-{job_id}.txt").read_text()
    assert "JobState=COMPLETED" in state, state + out
    check_job(subprocess.CompletedProcess([], 0, out, ""), jobdir)
    slurm.assert_clean(jobdir)
