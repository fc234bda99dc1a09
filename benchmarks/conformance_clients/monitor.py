"""DeepSpeed's docs/_tutorials/monitor.md: the engine's ``csv_monitor`` section (the tutorial's
JSON, tensorboard / wandb / comet left out: not installed, or online), then "Monitoring Custom
Metrics": ``MonitorMaster(DeepSpeedConfig("...json").monitor_config)`` and
``monitor.write_events([(name, value, step)])``; the files both write are listed at the end."""

import os
import time

import _tiny
import deepspeed
import torch
from deepspeed.monitor.monitor import MonitorMaster
from deepspeed.runtime.config import DeepSpeedConfig

args = _tiny.args()
model = _tiny.model()
model_engine, _, trainloader, _ = deepspeed.initialize(args=args, model=model,
                                                       model_parameters=model.parameters(),
                                                       training_data=_tiny.dataset())
ds_config = DeepSpeedConfig(args.deepspeed_config)
monitor = MonitorMaster(ds_config.monitor_config)
criterion = torch.nn.CrossEntropyLoss()
it = iter(trainloader)
for step in range(args.steps):
    pre = time.time()
    x, y = next(it)
    loss = criterion(model_engine(x.to(model_engine.device)), y.to(model_engine.device))
    model_engine.backward(loss)
    model_engine.step()
    post = time.time()
    events = [("Time per step", post - pre, model_engine.global_samples)]
    monitor.write_events(events)
    _tiny.report(step, loss)
if model_engine.global_rank == 0:
    for root, _, files in sorted(os.walk("output/ds_logs")):
        for f in sorted(files):
            print("monitor file", os.path.join(root, f))
