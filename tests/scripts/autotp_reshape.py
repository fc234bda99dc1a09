"""Rank script (tests/test_autotp_reshape.py): a tiny Hugging Face Llama (4 heads, 4 key/value
heads: TP 1, 2 and 4 all divide them; the model and batches of
tests/fixtures/autotp_universal) under AutoTP at ZeRO 0-2, against the same model trained
unsplit in a plain torch loop in this process (AdamW, clipping, the whole batch).

``--save DIR``: for each of ``--stages``, train the first ``steps_before_save`` steps at TP
``--tp``, ``save_checkpoint(DIR, tag="z<stage>")``, then the next ones (their losses: the
uninterrupted run). ``--load NAME=STAGE:UNIVERSAL:DIR[:TAG]`` (repeated): a fresh engine (other
initial weights) at TP ``--tp`` and ZeRO STAGE (``checkpoint.load_universal`` when UNIVERSAL is
1) loads DIR (TAG, or the latest) and trains the next steps; an error is recorded as its
message. Writes ``{name: {"losses", "ref", "resumed_at"} or {"error"}}`` (losses averaged over
the ranks) to --out/rank_<r>.json."""

import argparse
import importlib.util
import json
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

import dslaunch

FIX_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "autotp_universal"
_spec = importlib.util.spec_from_file_location("autotp_fixture", FIX_DIR / "make_fixture.py")
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--tp", type=int, required=True)
p.add_argument("--save")
p.add_argument("--stages", default="0,1,2")
p.add_argument("--load", action="append", default=[])
args, _ = p.parse_known_args()
dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
dp, dp_rank = world // args.tp, rank // args.tp
N, M = fx.STEPS, fx.NEXT


def build(seed):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**fx.MODEL)).float()


def reference():
    model = build(0)
    opt = torch.optim.AdamW(model.parameters(), lr=fx.LR, weight_decay=0.01)
    losses = []
    for s in range(N + M):
        ids = fx.batch(s)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), fx.CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses[N:]


def engine_for(stage, seed, universal=False):
    model = build(seed)
    cfg = fx.config(args.tp, world, universal)
    cfg["optimizer"]["params"].pop("torch_adam")
    cfg["zero_optimization"] = {"stage": stage}
    engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def train(engine, steps):
    losses = []
    for s in steps:
        ids = fx.batch(s)[dp_rank::dp]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        t = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(t)
        losses.append(t.item() / world)
    return losses


ref = reference()
out = {}
if args.save:
    for stage in map(int, args.stages.split(",")):
        engine = engine_for(stage, 0)
        train(engine, range(N))
        engine.save_checkpoint(args.save, tag=f"z{stage}")
        out[f"z{stage}"] = {"losses": train(engine, range(N, N + M)), "ref": ref}
for spec in args.load:
    name, rest = spec.split("=", 1)
    stage, universal, where = rest.split(":", 2)
    path, _, tag = where.partition(":")
    try:
        engine = engine_for(int(stage), 1, universal == "1")
        engine.load_checkpoint(path, tag=tag or None)
        out[name] = {"resumed_at": engine.global_steps, "losses": train(engine, range(N, N + M)),
                     "ref": ref}
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}",
                     "trace": traceback.format_exc()[-3000:]}
    dist.barrier()
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(out))
dist.destroy_process_group()
