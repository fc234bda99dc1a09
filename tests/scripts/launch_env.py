"""Test rank: write this rank's launch env and argv to OUTDIR/rank_<RANK>.json."""
import json
import os
import sys

NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "DSLAUNCH_CONFIG", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED",
         "DSLAUNCH_TEST_VALUE", "DSLAUNCH_RESTART_COUNT"]
out = sys.argv[1]
record = {"env": {n: os.environ.get(n) for n in NAMES}, "argv": sys.argv, "name": __name__,
          "path0": sys.path[0], "cwd": os.getcwd()}
with open(os.path.join(out, f"rank_{os.environ['RANK']}.json"), "w") as f:
    json.dump(record, f)
print(f"wrote rank {os.environ['RANK']}")
