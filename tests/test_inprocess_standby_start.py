"""`--recover in-process`: the node's first standby process (launcher/agent.py) starts once the
node's ranks have made a step, not beside them, where its imports competed with theirs for the
cores and delayed the job's first step (benchmarks/bench_resilience.py part e: 42 s from start to
the first step against 23 s without in-process recovery on this project's loaded 2-core host).
A rank killed after that is still replaced by the warm standby."""

from __future__ import annotations

import re

import pytest
from test_launch import assert_no_leftovers, marker_env

from helpers import SCRIPTS, dslaunch

SCRIPT = SCRIPTS / "inject_train.py"


def _stamp(out: str, pattern: str) -> float:
    m = re.search(pattern, out, re.M)
    assert m, f"no line matching {pattern!r}:\n{out[-3000:]}"
    return float(m.group(1))


@pytest.mark.slow
def test_first_standby_starts_after_the_ranks_first_step(tmp_path):
    marker, env = marker_env()
    r = dslaunch("run", "--nproc-per-node", 2, "--omp-threads", 1, "--grace-period", 1,
                 "--log-dir", tmp_path / "logs", "--recover", "in-process", "--max-restarts", 1,
                 "--inject", "kill:rank=1,step=40", SCRIPT, "--steps", 45, "--step-sleep", 0.4,
                 env=env, timeout=300)
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-3000:]
    first_steps = [_stamp(out, rf"^\[rank {k}\] STEP {k} 1 ([\d.]+) ") for k in (0, 1)]
    standby_start = _stamp(out, r"^\[standby localhost\] START \S+ ([\d.]+) ")
    assert standby_start > max(first_steps)
    # the kill at step 40 found the standby ready: promoted, not a cold start (a promoted
    # standby's script printed START before the kill, and no new START comes from rank 1)
    assert "recovered in process" in r.stderr
    kill_at = out.index("kills itself (SIGKILL) at step 40")
    assert not re.search(r"^\[rank 1\] START ", out[kill_at:], re.M)
    assert "DONE 1 45" in out and "DONE 0 45" in out
    assert_no_leftovers(marker)
