"""DeepSpeed's docs/_tutorials/pipeline.md: an nn.Sequential-style layer list in a
``PipelineModule(layers=..., loss_fn=..., num_stages=2)``, ``deepspeed.initialize`` with the
pipeline module, and ``engine.train_batch(data_iter=...)`` over a ``RepeatingLoader`` (the
tutorial's "Training Loops" section), printing the loss train_batch returns."""

import _tiny
import deepspeed
import torch
import torch.nn as nn
from deepspeed.pipe import PipelineModule
from deepspeed.utils import RepeatingLoader

args = _tiny.args()
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(_tiny.IN, _tiny.HIDDEN), nn.ReLU(inplace=True),
                    nn.Linear(_tiny.HIDDEN, _tiny.HIDDEN), nn.ReLU(inplace=True),
                    nn.Linear(_tiny.HIDDEN, _tiny.CLASSES))
net = PipelineModule(layers=net, loss_fn=nn.CrossEntropyLoss(), num_stages=2)
engine, _, _, _ = deepspeed.initialize(args=args, model=net,
                                       model_parameters=[p for p in net.parameters()
                                                         if p.requires_grad])
loader = RepeatingLoader(torch.utils.data.DataLoader(
    _tiny.dataset(), batch_size=engine.train_micro_batch_size_per_gpu(), shuffle=False))
data_iter = iter(loader)
for step in range(args.steps):
    loss = engine.train_batch(data_iter=data_iter)
    _tiny.report(step, loss)
