"""Test rank: ``launch_fail.py OUTDIR MODE FAILRANK``. Every rank but FAILRANK announces itself
(OUTDIR/ready_<RANK>) and waits forever; FAILRANK waits until the others are ready, then fails:
MODE raise (ValueError), sigkill (kills itself), exit3 (sys.exit(3)), or once (raises only on the
first attempt, then exits 0 along with everyone)."""
import os
import signal
import sys
import time

out, mode, fail_rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def wait_forever():
    while True:
        time.sleep(0.2)


def fail_now():
    if mode == "raise":
        raise ValueError(f"deliberate failure in rank {rank}")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit3":
        sys.exit(3)


if mode == "once" and os.environ.get("DSLAUNCH_RESTART_COUNT") != "0":
    print(f"attempt {os.environ['DSLAUNCH_RESTART_COUNT']} ok")
    sys.exit(0)
if rank != fail_rank:
    open(os.path.join(out, f"ready_{rank}"), "w").close()
    print("waiting", flush=True)
    wait_forever()
others = [r for r in range(world) if r != fail_rank]
while not all(os.path.exists(os.path.join(out, f"ready_{r}")) for r in others):
    time.sleep(0.02)
if mode == "once":
    raise RuntimeError("first attempt fails")
print(f"rank {rank} failing: {mode}", flush=True)
fail_now()
