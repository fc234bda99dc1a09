"""Compression training, then ``redundancy_clean``: model size and an accuracy proxy, against the
same model trained uncompressed (issue 34's proof item).

    .venv/bin/python benchmarks/bench_compression_clean.py [--steps 300]

One process, dslaunch's engine (world of one, gloo). The example GPT (2 blocks, width 64, 4
heads, 64 bytes of context) trains on the standard library's source for ``--steps`` steps of 8
samples, twice from the same initial weights and data: uncompressed, and with
``compression_training`` (after step ``--offset``: weight quantization 8 -> 4 bits of both MLP
linears in forward, 50% l1 row pruning of ``mlp.fc`` with ``mlp.proj`` related, 50% l1 sparse
pruning of ``attn.qkv``). Measured on 32 held-out batches: cross-entropy and next-byte top-1
accuracy of the uncompressed model, the compressed (masked) model, and the model after
``redundancy_clean`` (rows removed, quantized values written into the weights); and the
parameter count, the state-dict bytes and the nonzero stored matrix weights of each (the masked
model stores its whole weights plus the masks). Prints a Markdown table
and writes ``benchmarks/results/compression_clean-<time>.json``.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import dslaunch  # noqa: E402
from dslaunch.compression import init_compression, redundancy_clean  # noqa: E402
from gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

MODEL = GPTConfig(seq_len=64, n_layer=2, d_model=64, n_head=4)
BATCH, EVAL_BATCHES = 8, 32


def _group(params, modules, related=None):
    group = {"params": params, "modules": modules}
    if related is not None:
        group["related_modules"] = related
    return group


def compression_section(offset: int, steps: int) -> dict:
    """The bits step 8 -> 7 -> 6 -> 5 -> 4 at P, 2P, 4P, 8P steps after ``offset`` (MoQ's rule):
    P is chosen so that training ends at 4 bits, the bits ``redundancy_clean`` writes."""
    shared = {"enabled": True, "schedule_offset": offset}
    return {
        "weight_quantization": {
            "shared_parameters": {**shared, "quantize_groups": 8, "quantization_type": "symmetric",
                                  "rounding": "nearest", "quantize_weight_in_forward": True},
            "different_groups": {"wq": _group({"start_bits": 8, "target_bits": 4,
                                               "quantization_period": max(1, (steps - offset) // 8)},
                                              ["mlp.fc", "mlp.proj"])}},
        "row_pruning": {"shared_parameters": {**shared, "method": "l1"},
                        "different_groups": {"rp": _group({"dense_ratio": 0.5}, ["mlp.fc"],
                                                          [["mlp.proj"]])}},
        "sparse_pruning": {"shared_parameters": {**shared, "method": "l1"},
                           "different_groups": {"sp": _group({"dense_ratio": 0.5},
                                                             ["attn.qkv"])}},
    }


def config(section=None) -> dict:
    cfg = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH,
           "steps_per_print": 10 ** 6, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}}
    if section is not None:
        cfg["compression_training"] = section
    return cfg


def train(model, cfg, batches, steps):
    engine, *_ = dslaunch.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for step in range(steps):
        tokens, targets = batches.batch_at(step)
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
    return engine.module


@torch.no_grad()
def evaluate(model, batches) -> dict:
    model.eval()
    loss = correct = count = 0.0
    for i in range(EVAL_BATCHES):
        tokens, targets = batches.batch_at(10 ** 6 + i)  # steps no training run reaches
        logits = model(tokens)
        loss += torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
        correct += (logits.argmax(-1) == targets).sum().item()
        count += targets.numel()
    model.train()
    return {"loss": loss / EVAL_BATCHES, "accuracy": correct / count}


def size(model) -> dict:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    weights = [p for n, p in model.named_parameters() if p.dim() > 1]
    return {"params": sum(p.numel() for p in model.parameters()),
            "state_dict_bytes": buf.getbuffer().nbytes,
            "nonzero_stored_matrix_weights": sum(int(torch.count_nonzero(p)) for p in weights),
            "mlp_fc_shape": list(model.blocks[0].mlp.fc.weight.shape)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--offset", type=int, default=100, help="compression switches on here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        batches = TextBatches(stdlib_bytes(1 << 22), seq_len=MODEL.seq_len, global_batch=BATCH)
        torch.manual_seed(0)
        initial = GPT(MODEL)
        results = {"steps": args.steps, "offset": args.offset, "model": vars(MODEL)}

        torch.manual_seed(1)
        plain = train(copy.deepcopy(initial), config(), batches, args.steps)
        results["uncompressed"] = {**evaluate(plain, batches), **size(plain)}

        section = compression_section(args.offset, args.steps)
        model = copy.deepcopy(initial)
        init_compression(model, {"compression_training": section})
        torch.manual_seed(1)
        model = train(model, config(section), batches, args.steps)
        results["compressed (masked)"] = {**evaluate(model, batches), **size(model)}
        redundancy_clean(model, {"compression_training": section})
        results["after redundancy_clean"] = {**evaluate(model, batches), **size(model)}
        dist.destroy_process_group()

    print("| model | eval loss | next-byte accuracy | parameters | state-dict bytes | "
          "nonzero stored matrix weights | mlp.fc |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in ("uncompressed", "compressed (masked)", "after redundancy_clean"):
        r = results[name]
        print(f"| {name} | {r['loss']:.4f} | {r['accuracy']:.4f} | {r['params']:,} | "
              f"{r['state_dict_bytes']:,} | {r['nonzero_stored_matrix_weights']:,} | "
              f"{r['mlp_fc_shape'][0]}x{r['mlp_fc_shape'][1]} |")
    out = os.path.join(HERE, "results", time.strftime("compression_clean-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(out)


if __name__ == "__main__":
    main()
