"""A GPT-2 training script written the way DeepSpeed users write one (``import deepspeed``,
``deepspeed.initialize``, ``engine.backward``, ``engine.step``). The same file trains on both
engines; which one depends only on how it is started:

    python -m dslaunch run --nproc-per-node 1 --as-deepspeed gpt2_ds_train.py --ds-config CFG ...
    PYTHONPATH=<deepspeed> python -m torch.distributed.run --standalone --nproc_per_node 1 \
        gpt2_ds_train.py --ds-config CFG ...

Model: transformers' GPT2LMHeadModel from a GPT2Config (no download), random init with a fixed seed,
dropout off. Data: synthetic token batches from a fixed seed (labels = inputs; the model shifts).
Every step prints one line ``BENCH_JSON {"step": i, "loss": ..., "step_s": ...}`` (the step time is
taken between two ``torch.cuda.synchronize()``: forward + backward + optimizer step), and the end
prints ``BENCH_JSON {"final": true, "peak_gpu_bytes": ..., "params": ..., ...}``. Only rank 0 prints.
Imports transformers and torch (and ``deepspeed``, whichever answers), never dslaunch.
"""

import argparse
import json
import os
import sys
import time

import torch

SIZES = {  # name: (n_layer, n_embd, n_head, n_positions, vocab)
    "tiny": (2, 64, 2, 128, 512),
    "small": (4, 256, 4, 256, 8192),
    "125m": (12, 768, 12, 1024, 50257),
    "355m": (24, 1024, 16, 1024, 50257),
    "760m": (36, 1280, 20, 1024, 50257),
    "1.3b": (24, 2048, 16, 1024, 50257),
    "1.5b": (48, 1600, 25, 1024, 50257),
}


def emit(obj):
    print("BENCH_JSON " + json.dumps(obj), flush=True)


def gpt2_config(size, seq):
    from transformers import GPT2Config

    n_layer, n_embd, n_head, n_pos, vocab = SIZES[size]
    return GPT2Config(vocab_size=vocab, n_positions=max(n_pos, seq), n_embd=n_embd, n_layer=n_layer,
                      n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def build_model(config):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(1234)
    try:
        return GPT2LMHeadModel(config, attn_implementation="sdpa"), "sdpa"
    except (TypeError, ValueError, ImportError):
        return GPT2LMHeadModel(config), getattr(config, "_attn_implementation", None)


def batches(n, micro_batch, seq, vocab, rank, device):
    g = torch.Generator().manual_seed(4321 + rank)
    for _ in range(n):
        yield torch.randint(0, vocab, (micro_batch, seq), generator=g).to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ds-config", required=True, help="DeepSpeed JSON config (written by the runner)")
    p.add_argument("--size", default="355m", choices=sorted(SIZES))
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1)  # DeepSpeed-style launchers pass it
    args = p.parse_args()

    import deepspeed

    with open(args.ds_config) as f:
        ds_config = json.load(f)
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available() and os.environ.get("BENCH_DEVICE", "cuda") == "cuda"
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    config = gpt2_config(args.size, args.seq)
    model, attn = build_model(config)
    params = sum(q.numel() for q in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    device = engine.device if hasattr(engine, "device") else (
        torch.device("cuda", local_rank) if cuda else torch.device("cpu"))
    t_init = time.perf_counter() - t_start

    def sync():
        if cuda:
            torch.cuda.synchronize()

    peak_init = torch.cuda.max_memory_allocated() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # peak_gpu_bytes: the training steps' peak
    total = args.warmup + args.steps
    for i, ids in enumerate(batches(total, args.micro_batch, args.seq, config.vocab_size, rank, device)):
        sync()
        t0 = time.perf_counter()
        out = engine(ids, labels=ids)
        loss = out.loss if hasattr(out, "loss") else out[0]
        engine.backward(loss)
        engine.step()
        sync()
        dt = time.perf_counter() - t0
        if rank == 0:
            emit({"step": i, "loss": float(loss.detach().float().item()), "step_s": round(dt, 6),
                  "warmup": i < args.warmup})
    if rank == 0:
        emit({"final": True, "params": params, "world_size": world, "micro_batch": args.micro_batch,
              "seq": args.seq, "size": args.size, "n_layer": config.n_layer, "n_embd": config.n_embd,
              "n_head": config.n_head, "vocab": config.vocab_size, "attn_implementation": attn,
              "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
              "peak_gpu_init_bytes": peak_init,
              "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
              "init_s": round(t_init, 3), "engine_module": type(engine).__module__,
              "engine_class": type(engine).__name__,
              "optimizer": type(getattr(engine, "optimizer", None)).__name__,
              "deepspeed_version": getattr(deepspeed, "__version__", None),
              "torch": torch.__version__, "python": sys.version.split()[0]})
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
