"""The hang watchdog across hosts (ssh launcher, 2 hosts x 2 ranks): rank 3 on host2, alive but
stuck after an all_reduce, is reported with its host and the function it sits in; the job stops
and nothing of it is left on any host."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def test_stuck_rank_on_host2_is_reported(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", "--hang-timeout", "4",
                           "--grace-period", "2", "stuck.py", cwd=jobdir, timeout=120)
    out, err = res.stdout, res.stderr
    assert res.returncode == 1, out[-2000:] + err[-2000:]
    for r in range(4):
        assert f"READY {r}" in out
    assert "NOT STOPPED" not in out
    assert "ranks 0-2 (host1,host2) wait in all_reduce #2 on world, 8 B" in err
    assert "rank 3 (host2): not in a collective; last all_reduce #1 on world" in err
    assert "in wait_for_lock" in err  # its stack, fetched from host2
    assert ("job failed: hang: rank 3 never entered all_reduce #2 on world that ranks 0-2 wait "
            "in; rank 3 is in wait_for_lock (stuck.py:13)") in err
    cluster.assert_clean(jobdir)
