"""DeepSpeed's docs/_tutorials/comms-logging.md: the ``comms_logger`` config section, ``import
deepspeed.comm as dist``, a direct ``dist.all_reduce(tensor)`` (logged too), the training loop,
then ``dist.log_summary()`` and ``dist.log_summary(show_straggler=True)``."""

import _tiny
import deepspeed
import deepspeed.comm as dist
import torch

args = _tiny.args()
model = _tiny.model()
model_engine, _, trainloader, _ = deepspeed.initialize(args=args, model=model,
                                                       model_parameters=model.parameters(),
                                                       training_data=_tiny.dataset())
tensor = torch.ones(4)
dist.all_reduce(tensor)
if model_engine.global_rank == 0:
    print(f"all_reduce -> {tensor.tolist()}")
criterion = torch.nn.CrossEntropyLoss()
it = iter(trainloader)
for step in range(args.steps):
    x, y = next(it)
    loss = criterion(model_engine(x.to(model_engine.device)), y.to(model_engine.device))
    model_engine.backward(loss)
    model_engine.step()
    _tiny.report(step, loss)
dist.log_summary()
dist.log_summary(show_straggler=True)
