"""Each rank: gloo all_reduce of rank+1, then one JSON line with what it saw."""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from argv_scan import shown_in_some_argv

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("REPORT " + json.dumps({
    "host": socket.gethostname(), "rank": int(os.environ["RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]), "world": dist.get_world_size(),
    "node_rank": int(os.environ["NODE_RANK"]), "sum": int(t.item()),
    "var": os.environ.get("DSL_T_VAR"), "file_var": os.environ.get("DSL_T_FILE"),
    "args": sys.argv[1:], "ompi_rank": os.environ.get("OMPI_COMM_WORLD_RANK"),
    "token": os.environ.get("DSL_T_TOKEN"), "plan_env": os.environ.get("DSLAUNCH_PLAN_ENV"),
    "token_in_argv": bool(os.environ.get("DSL_T_TOKEN"))
    and shown_in_some_argv(os.environ["DSL_T_TOKEN"]),
}), flush=True)
dist.destroy_process_group()
