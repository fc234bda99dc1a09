"""DeepSpeed's docs/_tutorials/zero.md: the stage 3 config it shows (CPU offload of optimizer and
parameters), the model built under ``deepspeed.zero.Init()`` ("Allocating Massive Megatron-LM
Models") and a full parameter read through ``deepspeed.zero.GatheredParameters`` ("Extracting
weights")."""

import _tiny
import deepspeed
import torch

args = _tiny.args()
with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config):
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
first = engine.module[0].weight
with deepspeed.zero.GatheredParameters(first, modifier_rank=None):
    if engine.global_rank == 0:
        print(f"gathered weight {tuple(first.shape)} norm {first.norm().item():.6f}")
