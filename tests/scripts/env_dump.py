"""Test rank: write this rank's whole environment, argv, CPU affinity and what torch thinks of its
launcher to OUTDIR/rank_<RANK>.json (OUTDIR: the first argument)."""
import json
import os
import socket
import sys

import torch.distributed as dist

out = sys.argv[1]
record = {"host": socket.gethostname(), "env": dict(os.environ), "argv": sys.argv[1:],
          "cpus": sorted(os.sched_getaffinity(0)), "torchelastic": dist.is_torchelastic_launched()}
with open(os.path.join(out, f"rank_{os.environ['RANK']}.json"), "w") as f:
    json.dump(record, f)
print(f"dumped rank {os.environ['RANK']}", flush=True)
