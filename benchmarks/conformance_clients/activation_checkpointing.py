"""DeepSpeed's activation checkpointing as docs/_tutorials/megatron.md wires it:
``deepspeed.checkpointing.configure(mpu, deepspeed_config=...)`` (no model parallelism here, so
mpu is None and the config's ``activation_checkpointing`` section holds the options),
``deepspeed.checkpointing.is_configured()``, and the hidden layers run through
``deepspeed.checkpointing.checkpoint``."""

import _tiny
import deepspeed
import torch
import torch.nn as nn

args = _tiny.args()
deepspeed.init_distributed()
deepspeed.checkpointing.configure(None, deepspeed_config=args.deepspeed_config)
assert deepspeed.checkpointing.is_configured()
checkpoint = deepspeed.checkpointing.checkpoint


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(_tiny.IN, _tiny.HIDDEN)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(_tiny.HIDDEN, _tiny.HIDDEN),
                                                  nn.GELU()) for _ in range(2))
        self.out = nn.Linear(_tiny.HIDDEN, _tiny.CLASSES)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = checkpoint(block, x)
        return self.out(x)


torch.manual_seed(0)
model = Net()
engine, _, loader, _ = deepspeed.initialize(args=args, model=model,
                                            model_parameters=model.parameters(),
                                            training_data=_tiny.dataset())
criterion = torch.nn.CrossEntropyLoss()
it = iter(loader)
for step in range(args.steps):
    x, y = next(it)
    loss = criterion(engine(x.to(engine.device)), y.to(engine.device))
    engine.backward(loss)
    engine.step()
    _tiny.report(step, loss)
