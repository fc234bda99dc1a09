"""Accelerate's DeepSpeed integration as its docs show it in code:
``Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1))``,
``accelerator.prepare(model, optimizer, loader)``, ``accelerator.backward(loss)``,
``optimizer.step()``. One process: on a CPU-only machine Accelerate sets up no process group for
DeepSpeed (docs/frameworks.md in dslaunch explains), so the multi-process form needs GPUs."""

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin

plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)
accelerator = Accelerator(deepspeed_plugin=plugin)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
g = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
print("engine", type(model).__module__)
for step, (xb, yb) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}")
