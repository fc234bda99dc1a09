"""The GPT-2 of ``gpt2_ds_train.py`` (same sizes, seed, synthetic tokens) through the Hugging Face
Trainer with ``TrainingArguments(deepspeed=CONFIG, bf16=...)``, as Trainer users run it. Which engine
trains depends only on how it is started:

    python -m dslaunch run --nproc-per-node 1 --as-deepspeed hf_gpt2_trainer.py --ds-config CFG ...
    PYTHONPATH=<deepspeed> python -m torch.distributed.run --standalone --nproc_per_node 1 \
        hf_gpt2_trainer.py --ds-config CFG ...

The config's ``optimizer`` (AdamW, its lr) and ``gradient_clipping`` are the Trainer's too
(learning_rate / max_grad_norm are set to the same values, so HF's "auto" checks agree). Timing: a
callback stamps every optimizer step's begin and end with ``torch.cuda.synchronize()``; the step time
is end - begin (forward, backward, step; the data loader's next batch is outside). Output lines are
the ones ``gpt2_ds_train.py`` prints: ``BENCH_JSON {"step": ...}`` per step, ``BENCH_JSON {"final":
true, ...}`` at the end (rank 0).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from gpt2_ds_train import SIZES, build_model, emit, gpt2_config
from transformers import Trainer, TrainerCallback, TrainingArguments


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ds-config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--size", default="355m", choices=sorted(SIZES))
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    args = p.parse_args()

    with open(args.ds_config) as f:
        ds = json.load(f)
    cuda = torch.cuda.is_available() and os.environ.get("BENCH_DEVICE", "cuda") == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    config = gpt2_config(args.size, args.seq)
    t_start = time.perf_counter()
    model, attn = build_model(config)
    params = sum(q.numel() for q in model.parameters())
    total = args.warmup + args.steps

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(4321)
            self.ids = torch.randint(0, config.vocab_size, (n, args.seq), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0, self.times, self.init_s = None, [], None

        def on_train_begin(self, a, state, control, **kw):
            self.init_s = time.perf_counter() - t_start
            if cuda:
                self.peak_init = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()

        def on_step_begin(self, a, state, control, **kw):
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            sync()
            self.times.append(time.perf_counter() - self.t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs and rank == 0 and self.times:
                i = len(self.times) - 1
                emit({"step": i, "loss": float(logs["loss"]), "step_s": round(self.times[i], 6),
                      "warmup": i < args.warmup})

    opt = ds.get("optimizer", {}).get("params", {})
    bf16 = bool(ds.get("bf16", {}).get("enabled"))
    targs = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=ds.get("gradient_accumulation_steps", 1), max_steps=total,
        learning_rate=opt.get("lr", 1e-4), weight_decay=opt.get("weight_decay", 0.0),
        adam_beta1=opt.get("betas", [0.9, 0.999])[0], adam_beta2=opt.get("betas", [0.9, 0.999])[1],
        adam_epsilon=opt.get("eps", 1e-8), max_grad_norm=ds.get("gradient_clipping", 1.0),
        lr_scheduler_type="constant", logging_steps=1, seed=1234, save_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=not cuda, dataloader_num_workers=0, bf16=bf16,
        deepspeed=args.ds_config,
    )
    clock = Clock()
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(total * args.micro_batch * world),
                      callbacks=[clock])
    out = trainer.train()
    if targs.process_index == 0:
        engine = trainer.model_wrapped
        try:
            import importlib.metadata as im
            dsv = im.version("deepspeed")
        except Exception:
            dsv = None
        emit({"final": True, "params": params, "world_size": targs.world_size, "micro_batch": args.micro_batch,
              "seq": args.seq, "size": args.size, "n_layer": config.n_layer, "n_embd": config.n_embd,
              "attn_implementation": attn,
              "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
              "peak_gpu_init_bytes": getattr(clock, "peak_init", None),
              "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
              "init_s": round(clock.init_s or 0.0, 3), "engine_module": type(engine).__module__,
              "engine_class": type(engine).__name__,
              "optimizer": type(getattr(engine, "optimizer", None)).__name__, "deepspeed_version": dsv,
              "trainer_train_runtime": out.metrics.get("train_runtime"),
              "hf_logged_losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
              "torch": torch.__version__, "python": sys.version.split()[0]})


if __name__ == "__main__":
    main()
