"""--max-restarts restarts the whole job on every host after a failure on one of them."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_whole_job_restarts_across_hosts(cluster, jobdir, launcher):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", launcher, "--max-restarts", "1",
                           "--grace-period", "2", "flaky.py", cwd=jobdir, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "restarting the whole job (restart 1 of 1) after: rank 3 (host host2)" in res.stderr
    for r in range(4):
        assert f"[host{r // 2 + 1}:{r}] ATTEMPT 1 RANK {r}" in res.stdout
    cluster.assert_clean(jobdir)
