"""Lightning's DeepSpeedStrategy on whatever `import deepspeed` gives (dslaunch's engine under
``dslaunch run --as-deepspeed``), on CPU, as far as Lightning goes there.

Lightning's Trainer refuses the strategy without CUDA GPUs (its own check), so the parts that do
not need one are driven through the strategy's own methods: its DeepSpeed config for ``--stage``,
``_setup_model_and_optimizer`` (its ``deepspeed.initialize`` call), training steps as its
precision plugin runs them (``engine.backward``, ``engine.step``), ``save_checkpoint`` (the
engine's, tag "checkpoint", Lightning's state as client state), then on rank 0 Lightning's
``convert_zero_checkpoint_to_fp32_state_dict`` (``get_optim_files`` / ``get_model_state_file`` /
``get_fp32_state_dict_from_zero_checkpoint``), and Lightning Fabric's ``load_checkpoint`` of that
checkpoint into a second engine. A single-process torch run on the whole batch is the
reference. Each rank writes ``<out>/rank_<r>.json``."""

import argparse
import copy
import json
import os

import torch
import torch.distributed as dist

STEPS, BATCH = 5, 4

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--stage", type=int, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

import deepspeed  # noqa: E402  (after argparse: the alias is already in place, as in any script)
from lightning.fabric.plugins.environments import LightningEnvironment  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.strategies import DeepSpeedStrategy  # noqa: E402
from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict  # noqa: E402


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def build():
    torch.manual_seed(0)
    return Net()


g = torch.Generator().manual_seed(1)
X, Y = torch.randn(STEPS * BATCH * 2, 8, generator=g), torch.randn(STEPS * BATCH * 2, 1, generator=g)

# the reference: one process, each step on both ranks' batches together
ref = build()
ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
ref_losses = []
for step in range(STEPS):
    lo = step * 2 * BATCH
    loss = torch.nn.functional.mse_loss(ref(X[lo:lo + 2 * BATCH]), Y[lo:lo + 2 * BATCH])
    loss.backward()
    ref_opt.step()
    ref_opt.zero_grad()
    ref_losses.append(loss.item())

result = {"deepspeed_version": deepspeed.__version__}
WORLD_SIZE = os.environ["WORLD_SIZE"]

# 1. Lightning's Trainer on a CPU: its own refusal
try:
    Trainer(accelerator="cpu", devices=2, strategy=DeepSpeedStrategy(stage=args.stage), max_steps=1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
        build(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=BATCH))
    result["trainer_error"] = None
except RuntimeError as err:
    result["trainer_error"] = str(err)
# Lightning's LightningEnvironment.teardown() deletes WORLD_SIZE from the environment (the
# Trainer's failed fit ran it); TorchElasticEnvironment's leaves it: put it back
result["world_size_env_after_trainer"] = os.environ.get("WORLD_SIZE")
os.environ["WORLD_SIZE"] = WORLD_SIZE

# 2. the strategy's own deepspeed.initialize, with the config it writes for the stage
strategy = DeepSpeedStrategy(stage=args.stage)
strategy.cluster_environment = LightningEnvironment()  # what the Trainer would give it here
strategy.parallel_devices = [torch.device("cpu")] * int(WORLD_SIZE)
deepspeed.init_distributed("gloo")  # the Trainer's setup_distributed does this first
# what Lightning's _format_batch_size_and_grad_accum_config adds at setup
strategy.config.update(train_micro_batch_size_per_gpu=BATCH, gradient_accumulation_steps=1, gradient_clipping=0.0)
result["lightning_config"] = copy.deepcopy(strategy.config)
model = build()
engine, optimizer = strategy._setup_model_and_optimizer(
    model, torch.optim.AdamW(model.parameters(), lr=1e-2), None)
strategy.model = engine
rank = dist.get_rank()
losses = []
for step in range(STEPS):  # as Lightning's DeepSpeedPrecision: backward, then step
    lo = step * 2 * BATCH + rank * BATCH
    loss = torch.nn.functional.mse_loss(engine(X[lo:lo + BATCH]), Y[lo:lo + BATCH])
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / dist.get_world_size())

from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer  # noqa: E402

result.update(engine_module=type(engine).__module__, losses=losses, ref_losses=ref_losses,
              zero_stage=engine.zero_optimization_stage(),
              optimizer_is_deepspeed_optimizer=isinstance(optimizer, DeepSpeedOptimizer),
              plain_optimizer_is_deepspeed_optimizer=isinstance(torch.optim.SGD(ref.parameters(), lr=1.0),
                                                                DeepSpeedOptimizer))

# 3. Lightning's save, then its conversion of that checkpoint to one fp32 file
ckpt = os.path.join(args.out, "epoch=0-step=5.ckpt")
strategy.save_checkpoint({"epoch": 0, "global_step": STEPS, "pytorch-lightning_version": "2.6.6",
                          "state_dict": {}, "optimizer_states": [], "loops": {"fit_loop": {"step": STEPS}}},
                         ckpt)
dist.barrier()

# 4. resume: Lightning Fabric's DeepSpeedStrategy.load_checkpoint into a second engine (it finds
# the engine by isinstance DeepSpeedEngine, the optimizer by isinstance DeepSpeedOptimizer); one
# more step on each engine must then give the same loss
from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeedStrategy  # noqa: E402

torch.manual_seed(7)  # other weights than the saved ones
fresh = Net()
engine2, optimizer2 = strategy._setup_model_and_optimizer(
    fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2), None)
state = {"model": engine2, "optimizer": optimizer2, "global_step": 0}
FabricDeepSpeedStrategy(stage=args.stage).load_checkpoint(ckpt, state=state)
result["resumed_global_step"] = state["global_step"]
lo = STEPS * 2 * BATCH - 2 * BATCH + rank * BATCH  # the last step's batch again
after = []
for e in (engine, engine2):
    loss = torch.nn.functional.mse_loss(e(X[lo:lo + BATCH]), Y[lo:lo + BATCH])
    e.backward(loss)
    e.step()
    after.append(torch.nn.functional.mse_loss(e(X[lo:lo + BATCH]), Y[lo:lo + BATCH]).item())
result["after_resume"] = after
if rank == 0:
    out = convert_zero_checkpoint_to_fp32_state_dict(ckpt, os.path.join(args.out, "fp32.pt"))
    reference = {k: v for k, v in ref.state_dict().items()}
    result["converted_keys"] = sorted(k for k in out if k != "state_dict")
    result["converted_max_diff"] = max((out["state_dict"][k] - v).abs().max().item() for k, v in reference.items())
    result["converted_names"] = sorted(out["state_dict"]) == sorted(reference)
    result["converted_client"] = {k: out[k] for k in ("epoch", "global_step", "loops")}
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump(result, f)
