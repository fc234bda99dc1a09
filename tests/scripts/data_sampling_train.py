"""Rank script for curriculum data sampling under the engine (data_efficiency.data_sampling):
``initialize(training_data=...)`` serves the data through DeepSpeedDataSampler. Each sample is
``[index, length, tokens...]``; the model is a tiny bag-of-tokens regressor. Trains --steps
steps, saves a checkpoint after --save-at steps (and goes on), or with --resume loads it first;
writes, per step, the sample indices of each micro batch this rank got, the difficulty the
post-process hook saw, and the loss, to --out/rank_{r}.json.
"""

import argparse
import json
import os

import torch

import dslaunch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save-dir", required=True)
p.add_argument("--save-at", type=int, default=0)
p.add_argument("--resume", action="store_true")
dslaunch.add_config_arguments(p)
args = p.parse_args()

SEQ = 12


class Samples(torch.utils.data.Dataset):
    """Sample i has length (i * 7) % SEQ + 1: its tokens, zero-padded to SEQ."""

    def __len__(self):
        return 240

    def __getitem__(self, i):
        length = (i * 7) % SEQ + 1
        tokens = [(i + j) % 31 + 1 for j in range(length)] + [0] * (SEQ - length)
        return torch.tensor([i, length] + tokens)


class BagOfTokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(32, 8, padding_idx=0)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, batch):
        prediction = self.head(self.embed(batch[:, 2:])).squeeze(-1)
        return torch.nn.functional.mse_loss(prediction, batch[:, 1].float() / SEQ)


torch.manual_seed(0)
model = BagOfTokens()
engine, _, loader, _ = dslaunch.initialize(args=args, model=model,
                                           model_parameters=model.parameters(),
                                           training_data=Samples())
seen_difficulty = []


def post_process(data, sampler_state):  # DeepSpeed's hook: the batch and the sampler's state
    seen_difficulty.append(sampler_state["current_difficulties"]["seqlen"])
    return data


engine.set_data_post_process_func(post_process)
if args.resume:
    path, _ = engine.load_checkpoint(args.save_dir)
    assert path is not None, "nothing to resume from"
rank, gas = engine.global_rank, engine.gradient_accumulation_steps()
record = {"rank": rank, "start": engine.global_steps, "steps": {}}
data = iter(loader)
for step in range(engine.global_steps, args.steps):
    micro, losses = [], []
    for _ in range(gas):
        batch = next(data)
        micro.append(batch[:, 0].tolist())
        assert int(batch[:, 1].max()) <= seen_difficulty[-1], (batch[:, 1], seen_difficulty)
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    record["steps"][step] = {"micro": micro, "difficulty": seen_difficulty[-1],
                             "loss": sum(losses) / gas}
    if args.save_at and engine.global_steps == args.save_at:
        engine.save_checkpoint(args.save_dir)
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
    json.dump(record, f)
