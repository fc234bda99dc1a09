"""Rank script (run with `dslaunch run --as-deepspeed`): a tiny Llama built from a transformers
config trained for a few steps through DeepSpeed's Ulysses names
(``deepspeed.runtime.sequence_parallel.ulysses_sp``: ``register_with_transformers`` returns the
mpu, ``UlyssesSPDataLoaderAdapter`` shards each batch), fp32, the first tokens of every sample
ignored (-100) so sequence shards hold unequal numbers of valid tokens. Single process: the plain
SP 1 run of the same batches. Rank 0 writes --out (JSON: the losses)."""

import argparse
import json

import deepspeed  # dslaunch, through the --as-deepspeed alias
import torch
from deepspeed.runtime.sequence_parallel.ulysses_sp import (
    UlyssesSPAttentionHF,
    UlyssesSPDataLoaderAdapter,
)
from deepspeed.utils import groups
from transformers import LlamaConfig, LlamaForCausalLM

from dslaunch.sequence.sharding import sequence_parallel_cross_entropy, shift_labels

p = argparse.ArgumentParser()
p.add_argument("--sp", type=int, default=1)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--out", required=True)
p.add_argument("--local_rank", type=int, default=-1)  # --as-deepspeed passes it, as deepspeed does
args = p.parse_args()

deepspeed.init_distributed()
rank = torch.distributed.get_rank()
SEQ = 32
torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                     attn_implementation="sdpa")
model = LlamaForCausalLM(config)
mpu = UlyssesSPAttentionHF.register_with_transformers(
    model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=args.sp,
    micro_batch_size=1, seq_length=SEQ, seq_length_is_variable=True)
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), mpu=mpu,
    config={"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": 1}})

g = torch.Generator().manual_seed(1)
samples = []
for _ in range(args.steps):
    ids = torch.randint(0, 64, (1, SEQ), generator=g)
    labels = ids.clone()
    labels[:, :11] = -100  # a prompt: not trained on
    samples.append({"input_ids": ids, "position_ids": torch.arange(SEQ).unsqueeze(0),
                    "labels": labels})
if args.sp == 1:
    batches = [dict(s, shift_labels=shift_labels(s.pop("labels"))) for s in samples]
else:  # every rank of the group draws its own samples; the adapter works through them all
    sp_rank = groups._get_sequence_parallel_rank()
    batches = UlyssesSPDataLoaderAdapter(samples[sp_rank::args.sp], sp_rank=sp_rank,
                                         sp_group=groups._get_sequence_parallel_group(),
                                         sp_world_size=args.sp, device=engine.device)
losses = []
for _, batch in zip(range(args.steps), batches):
    labels = batch.pop("shift_labels")
    logits = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    loss = sequence_parallel_cross_entropy(logits, labels, groups._get_sequence_parallel_group())
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
if rank == 0:
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "sp": groups._get_sequence_parallel_world_size()}, f)
