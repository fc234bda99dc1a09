"""TRL's SFTTrainer with a DeepSpeed config (``SFTConfig(deepspeed="ds.json")``), as TRL's docs
show it, offline: a word-level tokenizer made in memory (tokenizers' WordLevel, wrapped in
PreTrainedTokenizerFast), a tiny GPT-2 built from its config, a text dataset of 32 generated
sentences. 4 optimizer steps; prints the logged losses."""

import argparse
import random

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

p = argparse.ArgumentParser()
p.add_argument("--deepspeed", required=True)
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()

WORDS = ["the", "cat", "dog", "sat", "ran", "on", "mat", "far", "and", "a", "big", "small"]
vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[EOS]", *WORDS])}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]",
                                    unk_token="[UNK]")
rng = random.Random(0)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(32)]

config = SFTConfig(output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                   max_steps=4, learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1,
                   seed=0, save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True,
                   max_length=16, dataloader_num_workers=0, deepspeed=args.deepspeed)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(GPT2Config(
    vocab_size=len(vocab), n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
    embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, eos_token_id=2, bos_token_id=2))
trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_dict({"text": texts}),
                     processing_class=tokenizer)
trainer.train()
if config.process_index == 0:
    print("engine", type(trainer.model_wrapped).__module__)
    for e in trainer.state.log_history:
        if "loss" in e:
            print(f"step {int(e['step'])} loss {float(e['loss']):.6f}")
