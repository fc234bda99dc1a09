"""TRL's own ``prepare_deepspeed`` (trl.models.utils, TRL 1.16) building the frozen reference
model of its DPO / PPO trainers under ZeRO-3, run as it runs there: ``import deepspeed`` inside
TRL (``dslaunch run --as-deepspeed``), the config taken from Accelerate's DeepSpeedPlugin, plus
TRL's dotted top-level keys (``"zero_optimization.reduce_bucket_size"`` ...) sized from the
model's hidden size. The model is a tiny random GPT-2 (its head tied to the token embedding).
--out/result.json: the reference engine's loss on a batch, plain PyTorch's on the same batch, and
the engine's resolved ZeRO-3 knobs.
"""

import argparse
import copy
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from transformers import GPT2Config, GPT2LMHeadModel
from trl.models.utils import prepare_deepspeed

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
args = p.parse_args()

plugin = DeepSpeedPlugin(hf_ds_config={
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8}})
accelerator = Accelerator(deepspeed_plugin=plugin)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64,
                                   n_positions=16))
plain = copy.deepcopy(model).eval()
engine = prepare_deepspeed(model, accelerator)
tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    got = engine(tokens, labels=tokens).loss.item()
    want = plain(tokens, labels=tokens).loss.item()
zero = engine.config["zero_optimization"] if isinstance(engine.config, dict) else None
Path(args.out).mkdir(parents=True, exist_ok=True)
(Path(args.out) / "result.json").write_text(json.dumps({"engine": got, "plain": want,
                                                        "zero": zero}))
