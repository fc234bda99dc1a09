"""ZeRO++ qwZ + qgZ across two real (namespace) hosts x 2 ranks over ssh: the host groups come
from the launcher's ``LOCAL_WORLD_SIZE`` (no ``DSLAUNCH_FAKE_HOSTS``), the gradients cross the
hosts quantized, and training stays within 1% of plain ZeRO-3 (tests/scripts/zeropp_train.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "zeropp_train.py"


def test_qwz_qgz_two_hosts_train_like_plain_zero3(cluster, jobdir):
    hf = cluster.hostfile(jobdir / "hostfile")
    res = cluster.dslaunch("run", "-H", str(hf), "--launcher", "ssh", str(SCRIPT), "--steps", "6",
                           "--configs", "plain,both", "--out", str(jobdir / "out.json"),
                           cwd=jobdir, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((jobdir / "out.json").read_text())
    c = out["collectives"]
    assert (c["hosts"], c["local_size"]) == (2, 2)
    assert c["qgz_int4_err_over_bound"] <= 1 and c["qwz_float32_err_over_bound"] <= 1
    plain, both = out["runs"]["plain"], out["runs"]["both"]
    assert max(abs(a - b) / b for a, b in zip(both["losses"], plain["losses"])) <= 0.01
    st = both["stats"]
    assert st["qwz_all_gather"]["bytes"] * 3.9 < plain["stats"]["all_gather"]["bytes"]
    assert st["qgz_inter_all_to_all"]["bytes"] * 7 < plain["stats"]["reduce_scatter"]["bytes"] / 2
    cluster.assert_clean(jobdir)
