"""The plain training loop of DeepSpeed's tutorials (getting-started.md) for the tutorials that
only add a config section: zero-offload.md (zero_offload.json), one-cycle.md (one_cycle.json),
lrrt.md (lrrt.json). The config file is the tutorial's section in a small config."""

import _tiny
import deepspeed
import torch

args = _tiny.args()
model = _tiny.model()
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
    if engine.global_rank == 0:
        print(f"lr {engine.get_lr()[0]:.6g}")
