"""Rank script of tests/test_pipe_universal.py: DeepSpeed 0.19.8's pipeline universal checkpoint
(tests/fixtures/pipe_universal: its PipelineModule of pipe_model.py's layers, one Block, untied)
loaded into a dslaunch PipelineEngine of --pp stages x --tp TP ranks (the config says
checkpoint.load_universal), trained on the fixture's next batches; writes --out/rank_{r}.json."""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # gpt_tp (TP plan)
from pipe_model import layer_list, loss_fn, pipe_specs

import dslaunch
from dslaunch.engine.parallel.topology import get_grid, make_topology
from dslaunch.pipe import PipelineModule

p = argparse.ArgumentParser()
p.add_argument("--fixture", required=True)
p.add_argument("--out", required=True)
p.add_argument("--pp", type=int, default=1)
p.add_argument("--tp", type=int, default=1)
args, _ = p.parse_known_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
fix = json.loads((Path(args.fixture) / "fixture.json").read_text())

dslaunch.init_distributed()
grid = get_grid(make_topology(dist.get_world_size(), pipe=args.pp, model=args.tp))
tp_group = grid.model_group if args.tp > 1 else None
module = PipelineModule(pipe_specs(layer_list(tp_group=tp_group, n_blocks=fix["blocks"])),
                        topology=grid.topology, loss_fn=loss_fn, seed_layers=True,
                        base_seed=99)  # other weights than the checkpoint's: the load sets them
engine, _, _, _ = dslaunch.initialize(args=args, model=module)
_, client = engine.load_checkpoint(str(Path(args.fixture) / "ckpt"))
start, mb, gas = engine.global_steps, fix["micro"], fix["gas"]
losses = []
for step in range(start, start + len(fix["universal_losses"])):
    tok, tgt = (torch.tensor(t) for t in fix["batches"][str(step)])
    it = iter([(tok[i * mb:(i + 1) * mb], tgt[i * mb:(i + 1) * mb]) for i in range(gas)])
    losses.append(engine.train_batch(it).item())
(out / f"rank_{dist.get_rank()}.json").write_text(json.dumps(
    {"rank": dist.get_rank(), "start": start, "losses": losses}))
