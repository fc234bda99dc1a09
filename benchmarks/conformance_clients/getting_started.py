"""DeepSpeed's docs/_tutorials/getting-started.md as typed: deepspeed.initialize(args=cmd_args,
model=, model_parameters=), the forward / backward / step loop, then save_checkpoint with a
client_sd and load_checkpoint returning it, and training on from the loaded state. The config is
the tutorial's (getting_started.json) with fp16 replaced by bf16 (CPU). The tutorial types
``save_checkpoint(..., client_sd = client_sd)``; the keyword of both engines is ``client_state``
(DeepSpeed 0.19.8 raises TypeError on ``client_sd``), so the snippet passes it as that."""

import tempfile

import _tiny
import deepspeed
import torch

cmd_args = _tiny.args()
model = _tiny.model()
params = [p for p in model.parameters() if p.requires_grad]
model_engine, optimizer, data_loader, _ = deepspeed.initialize(
    args=cmd_args, model=model, model_parameters=params, training_data=_tiny.dataset())
criterion = torch.nn.CrossEntropyLoss()


def train(steps, first):
    it = iter(data_loader)
    for step in range(first, first + steps):
        x, y = next(it)
        x = x.to(model_engine.device).to(next(model_engine.parameters()).dtype)
        loss = criterion(model_engine(x).float(), y.to(model_engine.device))
        model_engine.backward(loss)
        model_engine.step()
        _tiny.report(step, loss)
    return step


step = train(3, 0)
save_dir = tempfile.mkdtemp() if torch.distributed.get_rank() == 0 else None
obj = [save_dir]
torch.distributed.broadcast_object_list(obj, 0)
save_dir = obj[0]
client_sd = {"step": step}
model_engine.save_checkpoint(save_dir, "tag1", client_state=client_sd)
_, client_sd = model_engine.load_checkpoint(save_dir, "tag1")
step = client_sd["step"]
train(3, step + 1)
