"""DeepSpeed's own Muon on muon_train.py's tiny model and data (run with the peer venv's
python, not a CI dependency): the numbers tests/test_muon_zero.py's docstring records.

    OMP_NUM_THREADS=1 benchmarks/.peer-venv/bin/torchrun --standalone --nproc-per-node 2 \
        tests/scripts/muon_peer.py --config c.json --out o.json
"""

import argparse
import faulthandler
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from muon_train import BATCH, Tiny, data

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=8)
a = ap.parse_args()
if os.environ.get("MUON_PEER_DUMP_AFTER"):  # where a slow peer spends its time
    faulthandler.dump_traceback_later(int(os.environ["MUON_PEER_DUMP_AFTER"]), repeat=True)

import deepspeed  # noqa: E402
import deepspeed.comm.torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# DeepSpeed's CPU shared-memory all-reduce op is not built: its JIT compile took over 10 minutes
# on the loaded test machine, and both sides then reduce with gloo. Run with
# TORCH_COMPILE_DISABLE=1 (muon_update eager: no inductor build) and "torch_adam": true in the
# config (the AdamW half as torch.optim.AdamW instead of building the fused_adam op).
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (the attribute is torch)

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = Tiny()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=json.loads(Path(a.config).read_text()))
rank, world = dist.get_rank(), dist.get_world_size()
gas = engine.gradient_accumulation_steps()
rows = BATCH // (gas * world)
losses = []
for step in range(a.steps):
    tok, tgt = data(step)
    tot = torch.zeros(1)
    for m in range(gas):
        lo = m * BATCH // gas + rank * rows
        loss = engine(tok[lo:lo + rows], tgt[lo:lo + rows])
        engine.backward(loss)
        engine.step()
        tot += loss.detach() / gas
    dist.all_reduce(tot)
    losses.append(tot.item() / world)
if rank == 0:
    aux = getattr(engine.basic_optimizer, "aux_optimizer", None)
    Path(a.out).write_text(json.dumps({"losses": losses, "deepspeed": deepspeed.__version__,
                                       "optimizer": type(engine.basic_optimizer).__name__,
                                       "aux_optimizer": type(aux).__name__}))
dist.destroy_process_group()
