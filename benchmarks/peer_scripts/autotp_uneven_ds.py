"""DeepSpeed 0.19.8 (the peer venv) on the uneven Llama of tests/scripts/autotp_train.py (build
"llama_uneven": 6 query / 3 key-value heads, MLP 99) at AutoTP 2, ZeRO 1, the same batches, config
and 10 steps as tests/test_autotp_uneven.py: prints each rank's layer-0 shapes and losses, to set
beside dslaunch's (rank_0.json "llama_uneven_z1"). With the argument ``preset``: the same under
``preset_model: "llama"`` (DeepSpeed's layer specs; dslaunch's "llama_uneven_preset_z1" of
``autotp_train.py --uneven-specs``). Run:
benchmarks/.peer-venv/bin/torchrun --nproc-per-node 2 benchmarks/peer_scripts/autotp_uneven_ds.py [preset]"""
import json
import sys

import deepspeed
import torch
import torch.distributed as dist
import transformers

BATCH, SEQ, VOCAB, MICRO = 8, 12, 96, 2
torch.manual_seed(0)
common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=99, num_hidden_layers=2,
              num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=64, attention_dropout=0.0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).float()
cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
       "gradient_clipping": 0.5, "zero_optimization": {"stage": 1},
       "tensor_parallel": {"autotp_size": 2, **({"preset_model": "llama"} if "preset" in sys.argv[1:] else {})},
       "steps_per_print": 1000}
eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
shapes = {n: list(p.shape) for n, p in eng.module.named_parameters() if "layers.0." in n}
losses = []
for step in range(10):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    tot = 0.0
    for m in range(MICRO):
        rows = ids[m * 4:(m + 1) * 4]
        loss = eng(input_ids=rows, labels=rows).loss
        eng.backward(loss)
        eng.step()
        tot += loss.item() / MICRO
    losses.append(tot)
if dist.get_rank() in (0, 1):
    print("RESULT", dist.get_rank(), json.dumps({"losses": losses, "shapes": shapes}))
