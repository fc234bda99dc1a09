"""Test rank: write this rank's launch env and argv to OUTDIR/rank_<RANK>.json, and whether the
value of DSLAUNCH_TEST_TOKEN shows in any process's command line on this machine (plain, or
inside a dslaunch plan)."""
import json
import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "multihost" / "scripts"))
from argv_scan import shown_in_some_argv

NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "DSLAUNCH_CONFIG", "DSLAUNCH_CONFIG_PATH", "OMP_NUM_THREADS",
         "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED",
         "DSLAUNCH_TEST_VALUE", "DSLAUNCH_RESTART_COUNT", "DSLAUNCH_TEST_TOKEN", "DSLAUNCH_PLAN_ENV"]
out = sys.argv[1]
record = {"env": {n: os.environ.get(n) for n in NAMES}, "argv": sys.argv, "name": __name__,
          "path0": sys.path[0], "cwd": os.getcwd()}
if os.environ.get("DSLAUNCH_TEST_TOKEN"):
    record["token_in_argv"] = shown_in_some_argv(os.environ["DSLAUNCH_TEST_TOKEN"])
with open(os.path.join(out, f"rank_{os.environ['RANK']}.json"), "w") as f:
    json.dump(record, f)
print(f"wrote rank {os.environ['RANK']}")
