"""The Hugging Face Trainer on a tiny causal LM built from its config (no download), as its
users run it: ``TrainingArguments(deepspeed=ds.json)`` under ``dslaunch run --as-deepspeed``, or
without ``--deepspeed`` under torchrun for plain DDP (the reference). Rank 0 writes
``<out>/result.json``: the logged losses, which engine trained, and what was saved.

    --model gpt2|llama  --steps N  --grad-accum K  --save-steps S (checkpoints)  --resume DIR|last
    --eval (trainer.evaluate() after training)
    --save-model (trainer.save_model() + the gathered weights beside it, to compare)
    --zero-init (build the model after TrainingArguments, so ZeRO-3 builds it partitioned; the
    default builds it first, as DDP does, so both start from the same weights)
"""

import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--deepspeed", default=None)
p.add_argument("--out", required=True)
p.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
p.add_argument("--steps", type=int, default=5)
p.add_argument("--grad-accum", type=int, default=2)
p.add_argument("--save-steps", type=int, default=0)
p.add_argument("--resume", default=None)
p.add_argument("--save-model", action="store_true")
p.add_argument("--zero-init", action="store_true",
               help="build the model after TrainingArguments: under ZeRO-3 that is zero.Init")
p.add_argument("--bf16", action="store_true")
p.add_argument("--eval", action="store_true", help="trainer.evaluate() after training")
p.add_argument("--local_rank", type=int, default=-1)  # dslaunch run --as-deepspeed passes it
args = p.parse_args()

VOCAB, SEQ = 96, 16
if args.model == "gpt2":
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
else:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=SEQ)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}



def build():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


model = None if args.zero_init else build()
training_args = TrainingArguments(
    output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=2,
    gradient_accumulation_steps=args.grad_accum, max_steps=args.steps, learning_rate=3e-3,
    weight_decay=0.01, lr_scheduler_type="constant", logging_steps=1, seed=0,
    save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
    report_to=[], disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    dataloader_num_workers=0, deepspeed=args.deepspeed, bf16=args.bf16,
)
if args.zero_init:  # after TrainingArguments, under ZeRO-3 from_config builds it partitioned
    model = build()
partitioned = [getattr(getattr(p, "ds_status", None), "name", "") == "NOT_AVAILABLE"
               for p in model.parameters()]
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(64))
resume = args.resume
if resume == "last":
    resume = True
trainer.train(resume_from_checkpoint=resume)
# (evaluate() before train() fails with DeepSpeed's engine too: Accelerate frees the evaluation
# engine at train() and the Trainer keeps using it)
evals = [trainer.evaluate(Tokens(16, seed=99))["eval_loss"]] if args.eval else []

result = {
    "losses": {int(e["step"]): e["loss"] for e in trainer.state.log_history if "loss" in e},
    "engine_module": type(trainer.model_wrapped).__module__,
    "deepspeed": trainer.is_deepspeed_enabled,
    "world_size": training_args.world_size,
    "built_partitioned": all(partitioned),
    "eval_losses": evals,
}
if trainer.is_deepspeed_enabled:  # what our engine resolved from the config Transformers filled
    engine = trainer.model_wrapped
    filled = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
    result["engine"] = {
        "micro": engine.train_micro_batch_size_per_gpu(), "gas": engine.gradient_accumulation_steps(),
        "train_batch": engine.train_batch_size(), "stage": engine.zero_optimization_stage(),
        "optimizer": type(engine.optimizer).__module__ + "." + type(engine.optimizer).__name__,
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "filled_zero": filled["zero_optimization"], "filled_optimizer": filled.get("optimizer"),
    }
if args.save_model:
    trainer.save_model(os.path.join(args.out, "model"))
    # the reference: every parameter gathered from the engine, by name
    from accelerate.utils import is_deepspeed_available
    params = dict(trainer.model.named_parameters())
    if trainer.is_deepspeed_enabled and is_deepspeed_available():
        import deepspeed
        with deepspeed.zero.GatheredParameters(list(params.values())):
            full = {k: v.detach().clone() for k, v in params.items()}
    else:
        full = {k: v.detach().clone() for k, v in params.items()}
    if trainer.args.process_index == 0:
        torch.save(full, os.path.join(args.out, "gathered.pt"))
if training_args.process_index == 0:
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clean_exit import exit_cleanly  # noqa: E402

exit_cleanly()
