"""Run under the bootstrap with DSLAUNCH_PROGRESS_FILE set (one rank, gloo): makes plain
torch.distributed calls and prints, as JSON, what the progress record said after each
(tests/test_torch_progress.py asserts on it)."""

import json
import os
import sys
import threading

import torch
import torch.distributed as dist

from dslaunch import progress_record, torch_progress

out = {"installed_at_import": hasattr(dist.all_reduce, "__dslaunch_original__")}


def rec():
    r = progress_record.read(os.environ[progress_record.ENV])
    return {k: r[k] for k in ("coll_op", "coll_seq", "last_op", "last_seq", "last_group")}


dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
out["all_reduce"] = rec()
dist.all_gather_object([None], {"a": 1})  # calls all_gather inside: one record
out["all_gather_object"] = rec()
sub = dist.new_group([0])
dist.broadcast(t, 0, group=sub)
out["subgroup"] = rec()
work = dist.all_reduce(t, async_op=True)
out["async_issued"] = rec()
out["async_pending"] = len(torch_progress._PENDING)
work.wait()
out["async_waited_pending"] = len(torch_progress._PENDING)
from dslaunch.engine.comm.collectives import Comm  # noqa: E402

Comm().all_reduce(t)  # the engine records its own call: not counted twice
out["engine"] = rec()
dist.group.WORLD.allreduce([t]).wait()  # a ProcessGroup method called directly
out["group_method"] = rec()
th = threading.Thread(target=dist.all_reduce, args=(t,))
th.start()
th.join()
out["other_thread"] = rec()
torch_progress.uninstall()
out["uninstalled"] = not hasattr(dist.all_reduce, "__dslaunch_original__")
dist.all_reduce(t)
out["after_uninstall"] = rec()
dist.destroy_process_group()
json.dump(out, sys.stdout)
