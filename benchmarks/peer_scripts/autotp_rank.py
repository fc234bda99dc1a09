"""Rank script of benchmarks/bench_autotp.py: one Llama trained with AutoTP by dslaunch (``dslaunch
run``) or DeepSpeed (the peer venv's torchrun), the same model, data and config. ``--engine
dslaunch|deepspeed``; ``--size tiny`` (hidden 64, 2 layers, 4 heads / 2 key-value heads: the loss
check) or ``small`` (hidden 512, 4 layers, 8 / 4 heads, seq 256: the timing). Rank 0 prints one
``RESULT {json}`` line: the step losses, seconds per timed step, tokens/s of the job (each TP
group's tokens counted once), every rank's peak RSS and the local shapes of q_proj and the LM
head."""

import argparse
import json
import resource
import sys
import time

import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--engine", choices=["dslaunch", "deepspeed"], required=True)
p.add_argument("--size", choices=["tiny", "small"], default="tiny")
p.add_argument("--tp", type=int, default=2)
p.add_argument("--stage", type=int, default=1)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=0)
p.add_argument("--vocab-parallel", action="store_true",
               help="tensor_parallel.vocab_parallel_lm_head: true (the LM head split by vocabulary)")
args, _ = p.parse_known_args()
if args.engine == "deepspeed":
    import deepspeed as ds

    ds.init_distributed(dist_backend="gloo")
else:
    import dslaunch as ds

    ds.init_distributed()
import torch.distributed as dist  # noqa: E402

rank, world = dist.get_rank(), dist.get_world_size()
dp, dp_rank = world // args.tp, rank // args.tp
if args.size == "tiny":
    shape = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    micro, seq = 4, 12
else:
    shape = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4)
    micro, seq = 4, 256
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    **shape, max_position_embeddings=max(seq, 64))).float()
gas = 2
params = {"lr": 1e-2 if args.size == "tiny" else 3e-4, "weight_decay": 0.01}
if args.engine == "deepspeed":
    params["torch_adam"] = True  # torch's AdamW on both sides (no JIT-built fused op)
# train_batch_size counts every rank, TP ones too: DeepSpeed's count (dslaunch's the same)
config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
          "train_batch_size": micro * gas * world,
          "optimizer": {"type": "AdamW", "params": params}, "gradient_clipping": 1.0,
          "zero_optimization": {"stage": args.stage}, "tensor_parallel": {"autotp_size": args.tp,
                              "vocab_parallel_lm_head": args.vocab_parallel},
          "steps_per_print": 100000}
engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
vocab = shape["vocab_size"]
losses, times, cpu = [], [], []
for step in range(args.warmup + args.steps):
    ids = torch.randint(0, vocab, (micro * gas * dp, seq),
                        generator=torch.Generator().manual_seed(1000 + step))
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0.0
    for m in range(gas):
        lo = (dp_rank * gas + m) * micro
        loss = engine(input_ids=ids[lo:lo + micro], labels=ids[lo:lo + micro]).loss
        engine.backward(loss)
        engine.step()
        total += loss.item() / gas
    dist.barrier()
    if step >= args.warmup:
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # this process's CPU seconds, all its threads
    t = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(t)
    losses.append(t.item() / world)
rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64)
every = [torch.zeros_like(rss) for _ in range(world)]
dist.all_gather(every, rss)
if rank == 0:
    step_s = sorted(times)[len(times) // 2]
    q = engine.module.model.layers[0].self_attn.q_proj.weight
    print("RESULT " + json.dumps({
        "engine": args.engine, "size": args.size, "tp": args.tp, "dp": dp, "stage": args.stage,
        "losses": losses, "median_step_s": step_s,
        "cpu_s_per_step_rank0": sorted(cpu)[len(cpu) // 2],
        "tokens_per_s": micro * gas * dp * seq / step_s,
        "peak_rss_bytes_max_rank": int(max(t.item() for t in every)),
        "peak_rss_bytes_each_rank": [int(t.item()) for t in every],
        "q_proj_local_shape": list(q.shape),
        "lm_head_local_shape": list(engine.module.lm_head.weight.shape)}),
        flush=True)
dist.barrier()
sys.stdout.flush()
