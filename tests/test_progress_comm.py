"""The progress record written through the comm layer (engine/comm/collectives.py) and the engine's step
counter, read back as the agent reads it: one process, a real record file."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT

SCRIPT = r"""
import json, os, sys
import torch
from dslaunch import progress_record
import dslaunch.comm as dist
from dslaunch.engine.comm.collectives import group_label

path = os.environ["DSLAUNCH_PROGRESS_FILE"]
dist.init_distributed(dist_backend="gloo")
seen = {}
t = torch.ones(3)
dist.all_reduce(t)
seen["after_sync"] = progress_record.read(path)
work = dist.all_reduce(t, async_op=True)
seen["issued"] = progress_record.read(path)
work.wait()
seen["waited"] = progress_record.read(path)
sub = torch.distributed.new_group([0])
dist.broadcast(t, 0, group=sub)
dist.all_reduce(t)
seen["sub"] = progress_record.read(path)
seen["labels"] = [group_label(None), group_label(sub)]

import dslaunch
model = torch.nn.Linear(4, 2)
engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(), config={
    "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 2}})
for _ in range(3):
    loss = engine(torch.ones(2, 4)).sum()
    engine.backward(loss)
    engine.step()
seen["engine"] = progress_record.read(path)
print(json.dumps(seen))
"""


def test_collectives_and_steps_are_recorded(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "DSLAUNCH_PROGRESS_FILE": str(tmp_path / "progress.bin")}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    first = seen["after_sync"]
    assert (first["coll_op"], first["last_op"], first["last_group"], first["last_seq"]) == \
        ("", "all_reduce", "world", 1)
    # an async call counts when issued; the rank is "in" it only while it waits
    assert (seen["issued"]["coll_op"], seen["issued"]["last_seq"]) == ("", 2)
    assert (seen["waited"]["coll_op"], seen["waited"]["last_seq"]) == ("", 2)
    assert seen["labels"] == ["world", "ranks 0"]
    # each group has its own numbering: the broadcast on the sub-group did not move world's
    assert (seen["sub"]["last_op"], seen["sub"]["last_group"], seen["sub"]["last_seq"]) == \
        ("all_reduce", "world", 3)
    eng = seen["engine"]
    assert eng["step"] == 3 and eng["pid"] > 0
