"""Resume a ZeRO 1-2 checkpoint saved with another world size through the strategy's
load_resharded (what engine.load_checkpoint should call when the world size differs); prints the
per-step global losses from the checkpoint's step to step 20 as `LOSSES {json}` on rank 0."""
import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dslaunch  # noqa: E402
from dslaunch.engine.storage.files import load_file, model_file  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

torch.manual_seed(0)
model = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=32))
engine, *_ = dslaunch.initialize(model=model)
path = os.path.join(sys.argv[1], open(os.path.join(sys.argv[1], "latest")).read().strip())
st = load_file(model_file(path))
engine.strategy.load_module_state_dict(st["module"])
engine.strategy.load_resharded(path)
engine.global_steps, engine.micro_steps = st["global_steps"], st["micro_steps"]
engine.strategy.zero_grad()
rank, world = dist.get_rank(), dist.get_world_size()
b = TextBatches(stdlib_bytes(1 << 18), seq_len=32, global_batch=8)
out = {}
for step in range(engine.global_steps, 20):
    tot = torch.zeros(1)
    for m in range(2):
        tok, tgt = b.batch_at(step * 2 + m, rank, world)
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        tot += loss.detach() / 2
    dist.all_reduce(tot)
    out[step] = tot.item() / world
if rank == 0:
    print("LOSSES", json.dumps(out))
dist.barrier()
dist.destroy_process_group()
