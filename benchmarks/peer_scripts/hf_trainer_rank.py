"""One rank of bench_hf_trainer.py: the Hugging Face Trainer on a small GPT-2 built from its config
(no download), ``TrainingArguments(deepspeed=CFG)``, as Trainer users run it. The same file runs on
both engines; which one trains depends only on how it is started:

    dslaunch run --as-deepspeed --nproc-per-node 2 hf_trainer_rank.py --deepspeed CFG --out DIR
    <peer-venv>/bin/torchrun --standalone --nproc-per-node 2 hf_trainer_rank.py --deepspeed CFG --out DIR

Timing: a TrainerCallback stamps the end of every optimizer step; a step's time is the interval
since the previous step's end (so it holds the data loading, forward, backward, step and the
Trainer's per-step logging), the first ``--warmup`` steps are untimed. Start-up (imports, process
group, engine initialization) is outside every interval. The Trainer's own
``train_samples_per_second`` (its timer starts inside train(), warm-up steps included) is kept too.

Per rank it writes ``<out>/rank<N>.json``: step end stamps, peak RSS (ru_maxrss), which engine
class trained; rank 0 adds the logged losses. Imports transformers and torch only: no dslaunch.
"""

import argparse
import importlib.metadata
import json
import os
import resource
import time

import torch
from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainerCallback, TrainingArguments

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--deepspeed", required=True, help="the DeepSpeed-style JSON config")
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
p.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 1)")
p.add_argument("--micro-batch", type=int, default=4)
p.add_argument("--bf16", action="store_true")
p.add_argument("--smoke", action="store_true", help="a tiny GPT-2 (2 layers, hidden 32, seq 16)")
p.add_argument("--local_rank", type=int, default=-1)  # --as-deepspeed passes it, as DeepSpeed's launcher does
args = p.parse_args()

if args.smoke:
    VOCAB, SEQ = 96, 16
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
else:
    VOCAB, SEQ = 8192, 128
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=4, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
MAX_STEPS = args.warmup + args.steps
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepClock(TrainerCallback):
    def __init__(self):
        self.begin = None
        self.ends = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)  # before TrainingArguments: the same weights everywhere
NUM_PARAMS = sum(q.numel() for q in model.parameters())
training_args = TrainingArguments(
    output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=args.micro_batch,
    gradient_accumulation_steps=1, max_steps=MAX_STEPS, learning_rate=1e-3, weight_decay=0.01,
    lr_scheduler_type="constant", logging_steps=1, seed=0, save_strategy="no", report_to=[],
    disable_tqdm=True, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
    deepspeed=args.deepspeed, bf16=args.bf16,
)
clock = StepClock()
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(MAX_STEPS * args.micro_batch * WORLD),
                  callbacks=[clock])
out = trainer.train()

rank = training_args.process_index
try:
    ds_version = importlib.metadata.version("deepspeed")
except importlib.metadata.PackageNotFoundError:
    ds_version = None
result = {
    "rank": rank, "world_size": training_args.world_size,
    "engine_module": type(trainer.model_wrapped).__module__,
    "engine_class": type(trainer.model_wrapped).__name__,
    "deepspeed_enabled": trainer.is_deepspeed_enabled, "deepspeed_version": ds_version,
    "optimizer": type(getattr(trainer.model_wrapped, "optimizer", None)).__name__,
    "basic_optimizer": type(getattr(trainer.model_wrapped, "basic_optimizer", None)).__name__,
    "param_dtype": str(next(trainer.model_wrapped.module.parameters()).dtype)
    if hasattr(trainer.model_wrapped, "module") else None,
    "num_params": NUM_PARAMS,
    "samples_per_step": args.micro_batch * training_args.world_size, "warmup": args.warmup,
    "train_begin": clock.begin, "step_ends": clock.ends,
    "trainer_train_samples_per_second": out.metrics.get("train_samples_per_second"),
    "trainer_train_runtime": out.metrics.get("train_runtime"),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
}
if rank == 0:
    result["losses"] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
