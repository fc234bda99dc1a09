"""One plain process: load a `dslaunch ckpt to-fp32` file of a pipeline/TP checkpoint into the
unpartitioned PipelineModule (one stage, no TP) of the same layers, and compute the loss of the
job's eval batches (given in the ranks' JSON: each data rank's micro-batches), averaged like the
job's eval_batch: the mean over micro-batches, then over data ranks. Prints JSON."""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipe_model import layer_list, loss_fn, pipe_specs

p = argparse.ArgumentParser()
p.add_argument("--file", required=True)
p.add_argument("--ranks", required=True, help="directory of the job's rank_*.json")
p.add_argument("--tied", action="store_true")
p.add_argument("--blocks", type=int, default=2)
p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
               help="bf16: evaluate with the fp32 weights rounded to bf16, as the job held them")
args = p.parse_args()

from dslaunch.pipe import PipelineModule, load_consolidated  # noqa: E402

state = torch.load(args.file, map_location="cpu", weights_only=True)
module = PipelineModule(pipe_specs(layer_list(tied=args.tied, n_blocks=args.blocks)),
                        num_stages=1, loss_fn=loss_fn)
result = load_consolidated(module, state)  # strict: every parameter of the model is in the file
assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())
batches = {}
for f in sorted(Path(args.ranks).glob("rank_*.json")):
    rec = json.loads(f.read_text())
    if "eval_batches" in rec:
        batches[rec["dp_rank"]] = rec["eval_batches"]
# fp32 masters, not the rounded bf16 weights: some value is not representable in bf16
exact = all(torch.equal(v, v.bfloat16().float()) for v in state.values() if v.is_floating_point())
if args.dtype == "bf16":
    module.to(torch.bfloat16)
module.eval()
with torch.no_grad():
    per_dp = []
    for dp in sorted(batches):
        losses = [loss_fn(module(torch.tensor(x)), torch.tensor(y)) for x, y in batches[dp]]
        per_dp.append(torch.stack(losses).mean())
    loss = torch.stack(per_dp).mean().item()
print(json.dumps({"loss": loss, "keys": sorted(state), "dp_ranks": sorted(batches),
                  "missing": list(result.missing_keys),
                  "all_bf16_representable": exact}))
