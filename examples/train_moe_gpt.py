"""Train the byte-level GPT of examples/gpt.py with a mixture-of-experts MLP in every other block.

    dslaunch run --nproc-per-node 4 examples/train_moe_gpt.py --config configs/moe_gpt_zero1.json
        --experts 4 --ep 2 --top-k 1

The model is examples/moe_gpt.py's, written as a DeepSpeed-MoE script is (``from
deepspeed.moe.layer import MoE`` becomes
``from dslaunch.moe.layer import MoE``): blocks 1, 3, ... replace their MLP with
``MoE(d_model, expert=MLP, num_experts=--experts, ep_size=--ep, k=--top-k, ...)``; each rank
holds ``experts / ep`` of them and tokens travel to their expert by all-to-all over the
expert-parallel group. The loss is the cross entropy plus ``--aux-coef`` times the sum of the
layers' load-balancing losses. The engine reduces expert gradients over the expert-data-parallel
group, and ZeRO 1/2 partitions their optimizer states there (``dslaunch/engine/parallel/experts.py``).

Every ``--log-every`` steps rank 0 prints the loss, the auxiliary loss, the fraction of token
assignments dropped (over capacity: ``capacity = max(ceil(k x tokens / experts x
capacity_factor), min_capacity)`` per rank and layer, as the gate computes it; 0 with
``--dropless``, whose all-to-alls carry exactly the routed tokens) and tokens/s. ``--json
FILE``: those figures per step, the run's tokens/s after ``--warmup`` steps, the all-to-all
payload bytes per step (``engine.comm_stats()``), every rank's peak RSS and CPU seconds per step.
"""

import argparse
import json
import resource
import time

import torch
from moe_gpt import MoEGPT

import dslaunch
from dslaunch.moe.layer import MoE
from gpt import GPTConfig, TextBatches, stdlib_bytes  # examples/ is the script's directory


def all_to_all_bytes(engine) -> int:
    """Payload bytes this rank handed to the MoE layers' all-to-alls so far (engine.comm_stats)."""
    return engine.comm_stats().get("all_to_all", {}).get("bytes", 0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=int, default=4, help="experts per MoE layer")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (ranks sharing them)")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--capacity-factor", type=float, default=1.0)
    p.add_argument("--min-capacity", type=int, default=4)
    p.add_argument("--dropless", action="store_true", help="drop_tokens=False: no capacity")
    p.add_argument("--padded-dropless", action="store_true",
                   help="with --dropless: pad every expert's buffer to the busiest expert's "
                        "count (DeepSpeed's dispatch) instead of sending exactly the routed "
                        "tokens; for comparison")
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=4 << 20, help="bytes of stdlib text to use")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the tokens/s figure")
    p.add_argument("--json", default=None, help="rank 0 writes the per-step figures here")
    dslaunch.add_config_arguments(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    cfg = GPTConfig(seq_len=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                    d_model=args.d_model)
    model = MoEGPT(cfg, MoE, experts=args.experts, ep=args.ep, top_k=args.top_k,
                   capacity_factor=args.capacity_factor, min_capacity=args.min_capacity,
                   dropless=args.dropless, aux_coef=args.aux_coef)
    for layer in model.moe_layers:
        layer.moe.deepspeed_moe.ragged_dropless = not args.padded_dropless
    engine, _, _, _ = dslaunch.initialize(args=args, model=model)
    rank, world = engine.global_rank, engine.world_size
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    batch = engine.train_batch_size()
    data = TextBatches(stdlib_bytes(args.data_bytes), seq_len=args.seq_len, global_batch=batch,
                       seed=args.seed)
    if rank == 0:
        print(f"model {model.num_params() / 1e6:.2f}M params ({args.experts} experts in "
              f"{len(model.moe_layers)} layers, ep {args.ep}, top-{args.top_k}) | world {world} | "
              f"batch {batch} x seq {args.seq_len}", flush=True)
    steps, t0, a2a_at_warmup, cpu0 = [], None, 0, 0.0
    for step in range(args.steps):
        if step == args.warmup:
            t0, a2a_at_warmup = time.perf_counter(), all_to_all_bytes(engine)
            cpu0 = time.process_time()
        tokens, targets = data.batch_at(step, rank, world)
        tokens, targets = tokens.to(engine.device), targets.to(engine.device)
        loss_sum = aux_sum = drop_sum = 0.0
        for i in range(accum):
            sl = slice(i * micro, (i + 1) * micro)
            loss = engine(tokens[sl], targets[sl])
            engine.backward(loss)
            engine.step()
            loss_sum += float(loss.detach()) / accum
            aux_sum += model.last_aux / accum
            drop_sum += model.dropped_fraction() / accum
        # the figures averaged over the ranks
        figures = torch.tensor([loss_sum, aux_sum, drop_sum], dtype=torch.float64)
        torch.distributed.all_reduce(figures)
        loss_v, aux_v, drop_v = (figures / world).tolist()
        steps.append({"step": step + 1, "loss": loss_v, "aux_loss": aux_v, "dropped": drop_v})
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = ((step + 1 - args.warmup) * batch * args.seq_len
                    / (time.perf_counter() - t0)) if t0 and step >= args.warmup else 0.0
            print(f"step {step + 1:5d} | loss {loss_v:.4f} | aux {aux_v:.4f} | dropped "
                  f"{drop_v:.2%} | {rate:,.0f} tokens/s", flush=True)
    elapsed = time.perf_counter() - t0 if t0 else 0.0
    timed = args.steps - args.warmup
    rate = timed * batch * args.seq_len / elapsed if elapsed > 0 else 0.0
    a2a = (all_to_all_bytes(engine) - a2a_at_warmup) / max(timed, 1)
    rss = [None] * world
    torch.distributed.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        * 1024)  # Linux: KiB
    # CPU seconds per timed step, every rank (all its threads): work done, whatever else runs
    cpu = [None] * world
    torch.distributed.all_gather_object(
        cpu, (time.process_time() - cpu0) / max(timed, 1) if t0 else 0.0)
    if rank == 0:
        print(f"done: {args.steps} steps, {rate:,.0f} tokens/s (after {args.warmup} warm-up "
              "steps)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runtime": "dslaunch", "world": world, "steps": steps,
                           "tokens_per_s": rate, "all_to_all_bytes_per_step": a2a,
                           "peak_rss_bytes": rss, "cpu_seconds_per_step": cpu,
                           "comm": engine.comm_stats()}, f)
    return steps


if __name__ == "__main__":
    main()
