"""In-process recovery across hosts (ssh, namespace hosts with their own addresses): a rank of
host2 killed mid-job is replaced on host2 while the three others keep their processes; the losses
equal the fault-free run's, and nothing of the job is left on any host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_elastic import Job

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "recover_train.py")
STEPS = 8


def _run(cluster, jobdir, *extra) -> tuple:
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=2\n")
    job = Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
              "--log-dir", str(jobdir / "logs"), *extra, SCRIPT, str(STEPS))
    return job.finish()


def _losses(out: str) -> dict:
    return {int(s): float(v) for s, v in re.findall(r"step (\d+) loss ([\d.]+)", out)}


def test_rank_on_host2_replaced_in_process(cluster, jobdir):
    rc, out, err = _run(cluster, jobdir, "--recover", "in-process", "--max-restarts", "1",
                        "--inject", "kill:rank=3,step=3")
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "rank 3 (host host2) was killed by SIGKILL; recovering in process" in err, err[-3000:]
    assert "recovered in process" in err and "restarting" not in err
    starts = re.findall(r"rank (\d) pid (\d+) start", out)
    assert sorted(r for r, _ in starts) == ["0", "1", "2", "3", "3"]  # only rank 3 started again
    losses = _losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    rc, ref_out, ref_err = _run(cluster, jobdir)
    assert rc == 0, ref_err[-3000:]
    assert losses == _losses(ref_out)
    cluster.assert_clean(jobdir, hosts=["host1", "host2"])
