"""The Hugging Face Trainer with a DeepSpeed config, as its docs show it
(``TrainingArguments(deepspeed="ds.json")``, "auto" values filled by Transformers): a tiny GPT-2
built from its config after TrainingArguments (so under ZeRO-3 it is built by zero.Init), random
tokens, 4 optimizer steps of 2 accumulation micro-steps. Prints the logged losses."""

import argparse

import torch
from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--deepspeed", required=True)
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()

VOCAB, SEQ = 96, 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed=1234):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


training_args = TrainingArguments(
    output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
    learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, seed=0,
    save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True,
    dataloader_num_workers=0, deepspeed=args.deepspeed)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(GPT2Config(
    vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
    embd_pdrop=0.0, attn_pdrop=0.0))
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(64))
trainer.train()
if training_args.process_index == 0:
    print("engine", type(trainer.model_wrapped).__module__)
    for e in trainer.state.log_history:
        if "loss" in e:
            print(f"step {int(e['step'])} loss {float(e['loss']):.6f}")
