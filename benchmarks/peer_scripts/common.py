"""What every benchmark training script shares: arguments, model, data, timed loop, result file.

Each peer script (DDP, FSDP2, DeepSpeed, dslaunch) only supplies how to wrap the model and how to
do one training step; everything else (the model, its seed, the batches, what is timed, what is
written) comes from here, so the peers differ only in the runtime under test.

Plain torch + the standard library: it runs in the DeepSpeed peer venv too (no dslaunch import).
The model and data come from ``examples/gpt.py`` (loaded by path).

Per rank, the result is ``<out>/rank<N>.json``: step times (seconds, every step, warm-up
included and flagged), the loss of every step (rank-local loss of this rank's micro-batch, the
same quantity for every peer), peak RSS (``ru_maxrss``), thread settings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpt import GPT, GPTConfig, TextBatches, bench_config, stdlib_bytes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netcounters  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, help="directory for rank<N>.json")
    p.add_argument("--steps", type=int, default=20, help="timed steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--micro-batch", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: one GPU per rank, LOCAL_RANK's)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=8192)
    # DeepSpeed's launcher appends --local_rank=N; ranks read LOCAL_RANK from the env instead
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true",
                   help="tiny model (2 layers, hidden 64, vocab 512, seq 32) for a fast check")
    p.add_argument("--model", default=None, metavar="L,D,H",
                   help="layers,d_model,heads instead of the bench model (vocab --vocab, seq 128)")
    p.add_argument("--zero-extra", default="",
                   help="JSON object merged into zero_optimization (after BENCH_ZERO_EXTRA)")
    return p


def model_config(args) -> GPTConfig:
    if args.smoke:
        return GPTConfig(vocab_size=512, seq_len=32, n_layer=2, n_head=2, d_model=64)
    if getattr(args, "model", None):
        n_layer, d_model, n_head = (int(x) for x in args.model.split(","))
        return GPTConfig(vocab_size=args.vocab, seq_len=128, n_layer=n_layer, n_head=n_head, d_model=d_model)
    return bench_config(vocab_size=args.vocab)


def build_model(args) -> GPT:
    """The same initial weights on every rank and for every peer."""
    torch.manual_seed(args.seed)
    return GPT(model_config(args))


def build_batches(args, rank: int, world: int) -> list:
    """Every step's (tokens, targets) for this rank, built before the loop (not timed)."""
    cfg = model_config(args)
    data = TextBatches(stdlib_bytes(2 << 20), seq_len=cfg.seq_len,
                       global_batch=args.micro_batch * world, seed=args.seed,
                       vocab_size=cfg.vocab_size)
    batches = [data.batch_at(s, rank, world) for s in range(args.warmup + args.steps)]
    if args.device == "cuda":  # moved before the loop: host-to-device copies are not what is timed
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        batches = [(t.to(dev), y.to(dev)) for t, y in batches]
    return batches


def device_sync(args):
    """What makes a step's end real on this device: CUDA work is queued, so wait for it."""
    return torch.cuda.synchronize if args.device == "cuda" else None


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def run_loop(args, step_fn, batches, sync=None) -> tuple[list, list]:
    """Run ``step_fn(tokens, targets) -> loss tensor`` over every batch.

    Returns (step seconds, losses). A step is forward + backward + optimizer step + zero-grad; the
    collectives of gloo are blocking, so a step's end on one rank means its all-reduces are done.
    With BENCH_NETDEV=<iface> set, the interface's byte counters (this rank's network namespace)
    are sampled before the first step and after every step, outside the timed span (NETDEV).
    """
    iface = os.environ.get("BENCH_NETDEV")
    if iface:
        NETDEV.update(iface=iface, host=socket.gethostname(), rx=[], tx=[])
    times, losses = [], []
    for i, (tokens, targets) in enumerate(batches):
        if iface and i == 0:
            _sample_netdev()
        t0 = time.perf_counter()
        loss = step_fn(tokens, targets)
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach().float().item()))
        if iface:
            _sample_netdev()
    return times, losses


NETDEV: dict = {}  # filled by run_loop under BENCH_NETDEV, written by write_result


def _sample_netdev() -> None:
    rx, tx = netcounters.read_iface(NETDEV["iface"])
    NETDEV["rx"].append(rx)
    NETDEV["tx"].append(tx)


def write_result(args, runtime: str, times: list, losses: list, extra: dict | None = None) -> None:
    rank, world = rank_world()
    cfg = model_config(args)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "runtime": runtime,
        "rank": rank,
        "world_size": world,
        "precision": args.precision,
        "micro_batch": args.micro_batch,
        "seq_len": cfg.seq_len,
        "tokens_per_step": args.micro_batch * cfg.seq_len * world,
        "warmup": args.warmup,
        "step_seconds": times,
        "losses": losses,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "num_params": num_params(args),
        "torch": torch.__version__,
        "device": args.device,
    }
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
        result["gpu_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if NETDEV:
        result["netdev"] = NETDEV
    if extra:
        result.update(extra)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.rename(out / f"rank{rank}.json")


def num_params(args) -> int:
    """Parameter count of the bench model (built on the meta device: no memory)."""
    with torch.device("meta"):
        return GPT(model_config(args)).num_params()
