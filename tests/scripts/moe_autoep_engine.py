"""Rank script (2 ranks): a tiny Mixtral-style transformers model trained 3 steps by
``dslaunch.initialize`` as it is, then with the config's ``expert_parallel`` section at
autoep_size 1 and 2 (SGD, fp32; each rank its own batch). Writes the three loss lists and how
many expert parameters the optimizer holds to --out/rank_{r}.json."""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

import dslaunch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args, _ = p.parse_known_args()
dslaunch.init_distributed()
rank = dist.get_rank()


def build():
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=24,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=2, max_position_embeddings=32,
                                     num_local_experts=4, num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(cfg).float()
    with torch.no_grad():
        for n, prm in model.named_parameters():
            if n.endswith("gate.weight"):
                prm.normal_(0, 0.5)
    return model


def train(section):
    model = build()
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.5}}}
    if section:
        config["expert_parallel"] = section
    engine, opt, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                            config=config)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(7 + rank))
    losses = []
    for _ in range(3):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    experts = sum(1 for g in opt.param_groups for q in g["params"]
                  if getattr(q, "allreduce", True) is False)
    return losses, experts


res = {"ref": train(None)}
for size in (1, 2):
    res[f"ep{size}"] = train({"enabled": True, "autoep_size": size, "preset_model": "mixtral"})
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(res))
