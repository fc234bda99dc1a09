"""An Accelerate training script as its users write it: ``DeepSpeedPlugin(hf_ds_config=...)``
whose config may carry ``tensor_parallel.autotp_size``, ``accelerator.prepare(model, optimizer,
dataloader)``, ``accelerator.backward(loss)``. Run under ``dslaunch run --as-deepspeed`` (the
``deepspeed`` Accelerate imports is dslaunch's). Accelerate gives the ranks of one
tensor-parallel group the same batches; with ``--tp 1`` (one process) it is the unsplit run.
Rank 0 writes ``<out>/result.json``: the step losses, the engine's module and tensor-parallel
size, the shape of one split weight.

    --tp N  --steps S  --out DIR
"""

import argparse
import json
import os

import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--tp", type=int, default=2)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--local_rank", type=int, default=-1)  # dslaunch run --as-deepspeed passes it
args = p.parse_args()

VOCAB, SEQ, MICRO, ACCUM = 96, 12, 2, 2
ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": ACCUM,
             "train_batch_size": "auto", "gradient_clipping": 1.0,
             "zero_optimization": {"stage": 1}, "steps_per_print": 1000}
if args.tp > 1:
    ds_config["tensor_parallel"] = {"autotp_size": args.tp}
# backend="gloo": on a machine without an accelerator Accelerate otherwise sets up no process
# group for DeepSpeed and believes it runs alone (docs/frameworks.md); with it, its DeepSpeed path
# across processes is the one GPU machines take
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                          gradient_accumulation_steps=ACCUM,
                          kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])

torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)).float()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
ids = torch.randint(0, VOCAB, (args.steps * MICRO * ACCUM, SEQ),
                    generator=torch.Generator().manual_seed(1234))
data = torch.utils.data.DataLoader([{"input_ids": r, "labels": r} for r in ids],
                                   batch_size=MICRO, shuffle=False)
engine, optimizer, data = accelerator.prepare(model, optimizer, data)

losses, total = [], 0.0
for i, batch in enumerate(data):
    with accelerator.accumulate(engine):
        loss = engine(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    total += loss.item() / ACCUM
    if (i + 1) % ACCUM == 0:
        losses.append(total)
        total = 0.0

if accelerator.process_index == 0:
    q = engine.module.model.layers[0].self_attn.q_proj.weight
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"losses": losses, "engine_module": type(engine).__module__,
                   "world": accelerator.num_processes, "q_proj_shape": list(q.shape),
                   "micro": engine.train_micro_batch_size_per_gpu(),
                   "train_batch": engine.train_batch_size()}, f)
accelerator.wait_for_everyone()
