"""ZeRO++ quantized communication (qwZ, qgZ) on real ranks, several configs in ONE job.

1. The collectives alone (zero/quantized_comm.py) on known tensors: ``quantized_all_gather``
   (int8) and the hierarchical reduce-scatter (int4 and int8) against the exact results; the
   worst error is reported next to the bound the module docstring states.
2. The tiny GPT (examples/gpt.py) trained under ZeRO-3 with each ``--configs`` entry (plain,
   qwz, qgz, both; fp32, ``*_bf16``, ``*_offload``: parameters and optimizer offloaded to the
   CPU), each from the same seed and data: per-step losses and ``engine.comm_stats()``.
3. With qwZ: the exact gather (checkpoints, GatheredParameters) returns the shard's own values,
   the quantized one does not (but is within the int8 bound); 4. (config "both") the checkpoint,
   consolidated to fp32, equals the exactly gathered weights.

Rank 0 writes everything to ``--out``. Run with ``DSLAUNCH_FAKE_HOSTS=2`` on 4 ranks to make
two hosts of two ranks each.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dslaunch  # noqa: E402
from dslaunch.engine.comm.collectives import Comm  # noqa: E402
from dslaunch.engine.zero import quantized_comm as QC  # noqa: E402
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--configs", default="plain,qwz,qgz,both")
ap.add_argument("--out", required=True)
a, _ = ap.parse_known_args()

dslaunch.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
out = {"world": world}


# -- 1. the collectives on known tensors ------------------------------------------------------
def collectives():
    comm = Comm()
    groups = QC.host_layout_of(comm)
    res = {"hosts": groups.hosts, "local_size": groups.local_size}
    gen = torch.Generator().manual_seed(100 + rank)
    c = 3001  # odd: a short last block, an odd int4 tail
    # qwZ all-gather, fp32 and bf16
    for dtype in (torch.float32, torch.bfloat16):
        src = (torch.randn(c, generator=gen) * (rank + 1)).to(dtype)
        full = torch.empty(world * c, dtype=dtype)
        QC.quantized_all_gather(comm, full, src, 8, 256)
        exact = torch.empty(world * c, dtype=dtype)
        comm.all_gather_into_tensor(exact, src)
        ex = exact.float()
        err = 0.0
        for r in range(world):
            part = ex[r * c:(r + 1) * c]
            got = full.float()[r * c:(r + 1) * c]
            for lo in range(0, c, 256):
                blk = part[lo:lo + 256]
                scale = blk.abs().max().item() / 127
                e = (got[lo:lo + 256] - blk).abs().max().item()
                # bf16 output adds one bf16 rounding of the dequantized value
                slack = blk.abs().max().item() * (2 ** -8 if dtype == torch.bfloat16 else 1e-6)
                err = max(err, e / (scale / 2 + slack))
        res[f"qwz_{str(dtype)[6:]}_err_over_bound"] = err
        res[f"qwz_{str(dtype)[6:]}_own_chunk_equal"] = bool(torch.equal(
            full[rank * c:(rank + 1) * c], exact[rank * c:(rank + 1) * c]))
    # qgZ reduce-scatter, int4 and int8
    for bits in (4, 8):
        rs = QC.HierarchicalReduceScatter(comm, groups, bits, 256)
        inp = torch.randn(world * c, generator=gen)
        every = [torch.empty_like(inp) for _ in range(world)]
        dist.all_gather(every, inp)
        mine = torch.empty(c)
        rs(mine, inp.clone())
        exact = sum(e[rank * c:(rank + 1) * c] for e in every)
        # bound: each other host's partial sum rounded once, per block max|partial| / qmax / 2
        L = groups.local_size
        bound = torch.zeros(c)
        for h in range(groups.hosts):
            if h == groups.host:
                continue
            partial = sum(every[h * L + i][rank * c:(rank + 1) * c] for i in range(L))
            for lo in range(0, c, 256):
                bound[lo:lo + 256] += partial[lo:lo + 256].abs().max() / (127 if bits == 8 else 7) / 2
        err = (mine - exact).abs()
        res[f"qgz_int{bits}_err_over_bound"] = (err / (bound * (1 + 1e-5) + 1e-6)).max().item()
        res[f"qgz_int{bits}_rel_err"] = (err.norm() / exact.norm()).item()
    res["stats"] = comm.stats()
    return res


out["collectives"] = collectives()


# -- 2. training --------------------------------------------------------------------------------
def config(name):
    zero = {"stage": 3, "reduce_bucket_size": 20000, "stage3_param_persistence_threshold": 0,
            "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 5000,
            "stage3_max_live_parameters": 10000}
    if name.startswith(("qwz", "both")):
        zero["zero_quantized_weights"] = True
    if name.startswith(("qgz", "both")):
        zero["zero_quantized_gradients"] = True
    if "_hpz" in name:  # hpZ beside both: the combination bench_zeropp measures across hosts
        zero["zero_hpz_partition_size"] = 2
    if "_offload" in name:  # parameters and optimizer on the CPU (ZeRO-Offload / ZeRO-3 offload)
        zero["offload_optimizer"] = {"device": "cpu"}
        zero["offload_param"] = {"device": "cpu"}
    c = {"train_batch_size": 16, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
         "gradient_clipping": 0.5, "steps_per_print": 1000, "zero_optimization": zero}
    if name.endswith("_bf16"):
        c["bf16"] = {"enabled": True}
    return c


def train(name):
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=32))
    engine, _, _, _ = dslaunch.initialize(model=model, config=config(name))
    batches = TextBatches(stdlib_bytes(1 << 18), seq_len=32, global_batch=16)
    losses = []
    for step in range(a.steps):
        tok, tgt = batches.batch_at(step, rank, world)
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        tot = loss.detach().float().reshape(1)
        dist.all_reduce(tot)
        losses.append(tot.item() / world)
    res = {"losses": losses, "stats": engine.comm_stats()}
    store = engine.strategy.store
    if store.quantized_gather is not None:  # 3. exact vs quantized gathers of one bucket
        key = max(store.full, key=lambda k: store.full[k].numel())
        c = store.full[key].numel() // world
        store.gather(key)
        approx = store.full[key].float().clone()
        store.gather(key, exact=True)
        exact = store.full[key].float().clone()
        store.release(key)
        own = store.chunks[key[0]][key[1]].float()
        res["exact_gather_is_shard"] = bool(torch.equal(exact[rank * c:(rank + 1) * c], own))
        res["quantized_gather_differs"] = bool(not torch.equal(approx, exact))
        res["quantized_gather_max_err"] = (approx - exact).abs().max().item()
        res["exact_max_abs"] = exact.abs().max().item()
        if name == "both":  # 4. the checkpoint holds the unquantized weights
            from dslaunch.engine.checkpoint.consolidate import fp32_state_dict

            ckpt = Path(a.out).parent / f"ckpt_{name}"
            engine.save_checkpoint(str(ckpt))
            weights = engine.strategy.module_state_dict()  # an exact gather, on every rank
            dist.barrier()
            if rank == 0:
                saved, _ = fp32_state_dict(str(ckpt))
                res["checkpoint_equals_exact_weights"] = all(
                    torch.equal(saved[k], weights[k].float()) for k in saved)
    engine.destroy() if hasattr(engine, "destroy") else None
    return res


out["runs"] = {name: train(name) for name in a.configs.split(",")}
if rank == 0:
    Path(a.out).write_text(json.dumps(out, indent=1))
