"""A restart starts no rank on a host while the previous attempt's ranks there still stop.

With pdsh the launcher's stop closes the connections and the attempt is over for the launcher at
once, while each remote agent is still stopping its ranks (SIGTERM, grace period, SIGKILL): the
cause of test_restarts[pdsh]'s flake under load, where the next attempt's rank 0 met the old
rank 0 still listening on MASTER_PORT. Here the old ranks take their whole grace period on
purpose (they ignore SIGTERM; grace period 15 s, longer than a restarted rank takes to start
even on a loaded machine), so without the agent's node lock (launcher/node_lock.py) the next
attempt's rank 0 fails with EADDRINUSE (seen: "The server socket has failed to listen ...
EADDRINUSE", no restart left). With it, the restarted agents say they waited."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["pdsh", "ssh"])
def test_restart_waits_for_the_previous_ranks(cluster, jobdir, launcher):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", launcher, "--max-restarts", "1",
                           "--grace-period", "15", "slow_stop.py", cwd=jobdir, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "restarting the whole job (restart 1 of 1) after: rank 3 (host host2)" in res.stderr
    assert "EADDRINUSE" not in res.stdout + res.stderr
    for r in range(4):
        assert f"[host{r // 2 + 1}:{r}] ATTEMPT 1 RANK {r}" in res.stdout
    cluster.assert_clean(jobdir)
