"""Lightning or Accelerate, the way their users write it, on CPU. Plain DDP (no dslaunch, no
DeepSpeed): run by ``dslaunch run`` and by torchrun, the same losses must come out. With
``--deepspeed-stage N``: Accelerate's DeepSpeedPlugin (ZeRO stage N, its "auto" batch sizes
filled from the DataLoader) on whatever `import deepspeed` gives (dslaunch's engine under
``dslaunch run --as-deepspeed``); it must train as its DDP does. ``--dynamo-backend B`` gives
Accelerate a dynamo backend: with DeepSpeed it then calls ``engine.compile(backend=,
compile_kwargs=)``.
``--framework lightning|accelerate --out DIR``; each rank writes ``DIR/rank_<r>.json``: its
per-step losses (this rank's batch; Accelerate's end with the two losses of a save_state /
load_state round trip), final parameters' sum, and what the framework detected
(Lightning's cluster environment, Accelerate's distributed type and process layout, the module of
the engine that trained)."""

import argparse
import json
import os
import sys

import torch

STEPS, BATCH = 5, 4

parser = argparse.ArgumentParser()
parser.add_argument("--framework", choices=["lightning", "accelerate"], required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--deepspeed-stage", type=int, default=None)
parser.add_argument("--dynamo-backend", default=None)
parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launchers pass it
args = parser.parse_args()


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS * BATCH * 2, 8, generator=g), torch.randn(STEPS * BATCH * 2, 1, generator=g)
    return model, torch.utils.data.TensorDataset(x, y)


def lightning():
    import lightning as L

    model, data = model_and_data()
    losses = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, _):
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=False)
    trainer.fit(Module(), loader)
    env = trainer.strategy.cluster_environment
    return losses, model, {"cluster_environment": type(env).__name__,
                           "creates_processes_externally": env.creates_processes_externally,
                           "global_rank": trainer.global_rank, "world_size": trainer.world_size,
                           "local_rank": trainer.local_rank, "node_rank": trainer.node_rank}


def accelerate():
    from accelerate import Accelerator

    model, data = model_and_data()
    plugin = None
    if args.deepspeed_stage is not None:
        from accelerate.utils import DeepSpeedPlugin

        plugin = DeepSpeedPlugin(hf_ds_config={
            "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": 0.0,
            "zero_optimization": {"stage": args.deepspeed_stage}})
    acc = Accelerator(cpu=plugin is None, deepspeed_plugin=plugin,
                      **({"dynamo_backend": args.dynamo_backend} if args.dynamo_backend else {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=False)
    ddp, optimizer, loader = acc.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # save_state, one more step, load_state, the same step again: the same loss both times
    x, y = next(iter(loader))
    again = []
    acc.save_state(os.path.join(args.out, "state"))
    for reload in (False, True):
        if reload:
            acc.load_state(os.path.join(args.out, "state"))
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        again.append(torch.nn.functional.mse_loss(ddp(x), y).item())
    losses.append(again)
    return losses, model, {"distributed_type": str(acc.distributed_type), "process_index": acc.process_index,
                           "num_processes": acc.num_processes, "local_process_index": acc.local_process_index,
                           "backend": acc.state.backend, "ddp": type(ddp).__name__,
                           "engine_module": type(ddp).__module__,
                           "compiled": bool(getattr(ddp, "is_compiled", False))}


losses, model, detected = lightning() if args.framework == "lightning" else accelerate()
rank = int(os.environ["RANK"])
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump({"losses": losses, "param_sum": sum(p.double().sum().item() for p in model.parameters()),
               "detected": detected, "torchelastic_run_id": os.environ.get("TORCHELASTIC_RUN_ID")}, f)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clean_exit import exit_cleanly  # noqa: E402

exit_cleanly()
