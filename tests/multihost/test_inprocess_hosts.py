"""In-process recovery across hosts (ssh, namespace hosts with their own addresses): a rank of
host2 killed mid-job is replaced on host2 while the three others keep their processes; the losses
equal the fault-free run's, and nothing of the job is left on any host. host2 powered off: host1's
ranks go on alone, as a world of 2. A rank of host2 that hangs is replaced the same way, and the
checkpoints after the recovery are written as before."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_elastic import Job

from dslaunch.launcher import incidents

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "recover_train.py")
STEPS = 8


def _run(cluster, jobdir, *extra) -> tuple:
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=2\n")
    job = Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
              "--log-dir", str(jobdir / "logs"), *extra, SCRIPT, str(STEPS))
    return job.finish()


def _power_off_host2_at_step_6(cluster, job) -> tuple:
    """host2 down once rank 0 printed step 6, the job run to its end, host2 up again."""
    try:
        job.wait_for("step 6 loss")
        cluster.host_down("host2")
        return job.finish()
    finally:
        cluster.host_up("host2")


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


@pytest.mark.parametrize("config", ["{}", '{"zero_optimization": {"stage": 2}}',
                                    '{"zero_optimization": {"stage": 3}}'],
                         ids=["zero0", "zero2", "zero3"])
def test_powered_off_host_the_others_go_on_in_process(cluster, jobdir, config):
    """host2 powered off mid-job (link down, every process killed): the two ranks of host1 keep
    their processes and go on as a world of 2 from the interrupted step, their losses those of a
    single process trained with world 4 then 2 (within 1e-6 relative: the all-reduce adds in
    another order). At ZeRO 2 the optimizer shards of host2's ranks come from their copies on
    host1 (each rank's buddy is the same local rank on the next host), re-partitioned over 2; at
    ZeRO 3 the parameters' shards too."""
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=2\n")
    steps = 24
    job = Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
              "--log-dir", str(jobdir / "logs"), "--nnodes", "1:2", "--recover", "in-process",
              "--max-restarts", "1", "--env", "RECOVER_SLEEP=0.4", SCRIPT, str(steps), config)
    rc, out, err = _power_off_host2_at_step_6(cluster, job)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "go on without it (world size 4 -> 2)" in err, err[-3000:]
    assert "recovered in process" in err and "restarting" not in err, err[-5000:]
    starts = re.findall(r"rank (\d) pid (\d+) start", out)
    assert sorted(r for r, _ in starts) == ["0", "1", "2", "3"]  # nobody started again
    resumed = int(re.search(r"training goes on from step (\d+)", err).group(1))
    losses = _losses(out)
    assert sorted(losses) == list(range(1, steps + 1))
    env = dict(os.environ, RECOVER_REFERENCE=f"4@0,2@{resumed}")
    env.pop("DSLAUNCH_CONFIG", None)
    ref = subprocess.run([sys.executable, SCRIPT, str(steps)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = _losses(ref.stdout)
    for step, loss in losses.items():
        assert abs(loss - expected[step]) <= 1e-6 * max(1.0, abs(expected[step])), (step, loss,
                                                                                     expected[step])
    [inc] = incidents.read(str(jobdir / "logs" / "incidents.jsonl"))
    # at most one step redone: a rank of host2 can finish a step's all-reduce (and report it)
    # while host1's ranks still wait for its last chunk when the power goes
    assert inc["action"] == "in-process" and inc["kind"] == "lost" and inc["steps_redone"] <= 1
    assert (inc["world_size_before"], inc["world_size_after"]) == (4, 2)
    phases = {k: inc[k] for k in ("detect_seconds", "stop_seconds", "restart_seconds",
                                  "load_seconds", "seconds_to_training")}
    print(f"host loss in process: {phases}")  # pytest -s shows the phases
    cluster.assert_clean(jobdir, hosts=["host1", "host2"])


def test_hung_rank_on_host2_replaced_then_checkpoints_go_on(cluster, jobdir):
    """rank 3 (host2) hangs outside any collective at step 5: the watchdog pins it, host2's
    standby takes its place and the job saves checkpoints after the recovery as before (the
    replacement's collectives line up with the survivors', so no desync and no restart)."""
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=2\n")
    script = str(Path(SCRIPT).with_name("inject_train.py"))
    job = Job(cluster, jobdir, "-H", str(hf), "--launcher", "ssh", "--grace-period", "2",
              "--log-dir", str(jobdir / "logs"), "--recover", "in-process", "--max-restarts", "1",
              "--hang-timeout", "5", "--inject", "hang:rank=3,step=5", script,
              "--save-dir", str(jobdir / "ckpt"), "--save-every", "4", "--steps", "14",
              "--step-sleep", "0.1")
    rc, out, err = job.finish(timeout=240)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "recovered in process" in err and "restarting" not in err, err[-5000:]
    assert "desync" not in err.lower(), err[-5000:]
    assert sorted(re.findall(r"DONE (\d) 14", out)) == ["0", "1", "2", "3"], out[-3000:]
    assert (jobdir / "ckpt" / "latest").read_text().strip().endswith("12")
    cluster.assert_clean(jobdir, hosts=["host1", "host2"])


def test_powered_off_host_moves_to_the_spare_in_process(cluster, jobdir):
    """host2 powered off mid-job, host4 a spare of the hostfile and MIN 2 hosts: host1's ranks keep
    their processes, host2's ranks 2 and 3 start again on host4 as replacements (the standby
    processes host4's warm agent started with the job, torch already imported) and take their
    state from the survivors (at ZeRO 2 their optimizer shards from the copies on host1). The
    world keeps its size, so the losses are the fault-free run's, float for float. (ZeRO 0
    passes too; ZeRO 2 moves more state.)"""
    config = '{"zero_optimization": {"stage": 2}}'
    hf = jobdir / "hostfile"
    hf.write_text("host1 slots=2\nhost2 slots=2\nhost4 slots=2 spare\n")
    steps = 20
    args = ["-H", str(hf), "--launcher", "ssh", "--grace-period", "2", "--log-dir",
            str(jobdir / "logs"), "--nnodes", "2:2", "--max-restarts", "1"]
    job = Job(cluster, jobdir, *args, "--recover", "in-process", "--env", "RECOVER_SLEEP=0.4",
              SCRIPT, str(steps), config)
    rc, out, err = _power_off_host2_at_step_6(cluster, job)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "start again on the spare host host4" in err, err[-3000:]
    assert "replaced on the spare host host4" in err and "restarting" not in err, err[-5000:]
    assert "taking over node 1 (ranks 2, 3) from its 2 warm standby process(es)" in err, err[-5000:]
    starts = re.findall(r"\[host(\d):\d\] rank (\d) pid \d+ start", out)
    assert sorted(starts) == [("1", "0"), ("1", "1"), ("2", "2"), ("2", "3"), ("4", "2"), ("4", "3")]
    losses = _losses(out)
    assert sorted(losses) == list(range(1, steps + 1))
    rc, ref_out, ref_err = Job(cluster, jobdir, *args, SCRIPT, str(steps), config).finish()
    assert rc == 0, ref_err[-3000:]
    assert losses == _losses(ref_out)
    [inc] = incidents.read(str(jobdir / "logs" / "incidents.jsonl"))
    assert inc["action"] == "in-process" and inc["kind"] == "lost"
    assert (inc["world_size_before"], inc["world_size_after"]) == (4, 4)
    print(f"host loss onto a spare in process: {inc['detect_seconds']=} {inc['seconds_to_training']=}")
    cluster.assert_clean(jobdir, hosts=["host1", "host2", "host4"])
