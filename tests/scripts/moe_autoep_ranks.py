"""Rank script (2 ranks, gloo): AutoEP on tiny Mixtral-, Qwen2-MoE- and DeepSeek-V3-style
transformers models built from configs (no download). Per model: the same weights trained 3 SGD
steps as they are (the reference), with AutoEP at autoep_size 1 and at 2; each rank its own
batch; gradients summed (experts over their expert-data-parallel group, the rest over the world)
and divided by the world, as data parallelism averages them. Writes each run's losses and the
largest relative difference of the final expert weights to --out/rank_{r}.json."""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

import dslaunch
from dslaunch.engine.parallel.moe.auto_ep import ExpertParallelExperts, apply_autoep
from dslaunch.moe.utils import is_moe_param
from dslaunch.utils import groups

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args, _ = p.parse_known_args()
dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
COMMON = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=32, num_experts_per_tok=2)
MODELS = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(intermediate_size=24, num_local_experts=4)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(intermediate_size=24, moe_intermediate_size=12, num_experts=4,
                       shared_expert_intermediate_size=12, decoder_sparse_step=1)),
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM,
                    dict(intermediate_size=24, moe_intermediate_size=12, n_routed_experts=4,
                         n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
                         q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4,
                         qk_nope_head_dim=4, v_head_dim=4, head_dim=4)),
}


def build(name):
    cfg_cls, model_cls, extra = MODELS[name]
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**COMMON, **extra)).float()
    with torch.no_grad():  # visible routing: router weights and biases away from zero
        for n, prm in model.named_parameters():
            if "gate" in n and "proj" not in n:
                prm.normal_(0, 0.5)
    return model


def train(model, steps=3):
    losses = []
    g = torch.Generator().manual_seed(7 + rank)
    ids = torch.randint(0, 64, (2, 10), generator=g)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for prm in model.parameters():
                if prm.grad is None:
                    continue
                group = (groups._get_expert_data_parallel_group(prm.group_name)
                         if is_moe_param(prm) else None)
                dist.all_reduce(prm.grad, group=group)
                prm.add_(prm.grad / world, alpha=-0.5)
        losses.append(loss.item())
    return losses


def experts_of(model):
    """global expert id -> its weights, per MoE block, from this rank's modules."""
    out = {}
    for i, m in enumerate(x for x in model.modules() if hasattr(x, "gate_up_proj")):
        first = m.first_expert if isinstance(m, ExpertParallelExperts) else 0
        for j in range(m.gate_up_proj.shape[0]):
            out[(i, first + j)] = torch.cat([m.gate_up_proj[j].flatten(), m.down_proj[j].flatten()])
    return out


res = {}
for name in MODELS:
    ref = build(name)
    res[f"{name}_ref"] = train(ref)
    ref_experts = experts_of(ref)
    for size in (1, 2):
        model = build(name)
        res[f"{name}_replaced_{size}"] = apply_autoep(model, size, preset_model=name)
        res[f"{name}_ep{size}"] = train(model)
        res[f"{name}_ep{size}_experts"] = max(
            ((w - ref_experts[k]).abs().max() / ref_experts[k].abs().max()).item()
            for k, w in experts_of(model).items())
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"rank_{rank}.json").write_text(json.dumps(res))
