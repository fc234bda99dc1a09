"""One-off check (not in CI): dslaunch's random-LTD against DeepSpeed 0.19.8's in the peer venv.

    .venv/bin/python benchmarks/compare_random_ltd_ds.py [--peer PYTHON] [--steps N]

The script runs itself under the peer's interpreter (``--side deepspeed``, one process, gloo, the
CPU accelerator) and under ours (``--side dslaunch``), on the same weights and inputs, and
compares:

- the scheduler (``RandomLTDScheduler``) over 150 steps for four schedules: the kept length and
  the whole ``state_dict`` after each step (two ``update_seq`` calls per step, as two
  micro-batches make), and ``get_total_layer_tokens``;
- the engine: ``convert_to_random_ltd(engine, Block)`` after ``initialize``: which wrapped layers
  are bound, and their ids; the scheduler's state after each training step;
- the layer itself. DeepSpeed's gather, scatter and index sort are a CUDA op
  (``RandomLTDBuilder``) that cannot load on this CPU machine, so on its side the op module is
  replaced by a torch stand-in written here (``_TorchRandomLTDOp``: sort the indices, gather the
  kept tokens, write them back); everything else is DeepSpeed's code (the draw of the positions,
  their sharing between layers, the mask cut, the wrapper's forward and its autograd functions).
  Compared: the kept positions each step, the mask shape each dropping layer gets, the losses
  and the gradient of the first block's weight;
- the two places where the behaviours differ on purpose: under a ``gpt2.`` module prefix
  DeepSpeed binds layer 0 for id 2 (it looks for the id's digits anywhere in the name), and
  ``layer_token_lr_schedule.enabled`` is refused by DeepSpeed (dslaunch implements it).

Prints one JSON line and writes it to ``benchmarks/results/random_ltd_ds-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

SEQ, WIDTH, LAYERS, BATCH = 16, 8, 4, 2
SCHEDULE_STEPS = 150  # past every schedule's require_steps
SCHEDULES = [(4, 16, 5, 2), (3, 37, 11, 4), (8, 64, 100, 8), (16, 16, 3, 1)]  # min, max, steps, per


class Block(nn.Module):
    """Causal single-head attention with an additive mask keyword, plus a residual."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, hidden_states, attention_mask=None):
        q, k, v = self.qkv(hidden_states).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / WIDTH ** 0.5
        if attention_mask is not None:
            scores = scores + attention_mask[:, 0]
        return hidden_states + scores.softmax(-1) @ v


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x, attention_mask):
        for block in self.h:
            x = block(x, attention_mask=attention_mask)
        return x.pow(2).mean()


class Prefixed(nn.Module):
    """The same stack under ``gpt2.``: names ``gpt2.h.0`` ..."""

    def __init__(self):
        super().__init__()
        self.gpt2 = Stack()

    def forward(self, x, attention_mask):
        return self.gpt2(x, attention_mask)


def section(lo=4, hi=SEQ, steps=5, per=2, ids=(1, 2), lr=False):
    return {"enabled": True, "total_layer_num": LAYERS, "random_ltd_layer_num": len(ids),
            "random_ltd_layer_id": list(ids), "model_mask_name": "attention_mask",
            "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
            "random_ltd_schedule": {"min_value": lo, "max_value": hi, "schedule_type":
                                    "fixed_linear", "schedule_config": {"require_steps": steps,
                                                                        "seq_per_step": per}},
            "layer_token_lr_schedule": {"enabled": lr, "total_layer_tokens": 10 ** 6}}


def config(sec):
    return {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH,
            "steps_per_print": 10 ** 6,
            # explicit: DeepSpeed 0.19.8's default is 1.0 (its PR 8068), dslaunch's 0.0
            "gradient_clipping": 0.0,
            "data_efficiency": {"enabled": True, "data_routing": {"enabled": True,
                                                                  "random_ltd": sec}}}


def causal_mask():
    return torch.triu(torch.full((SEQ, SEQ), -1e9), 1).expand(BATCH, 1, SEQ, SEQ).contiguous()


# -- the two runtimes --------------------------------------------------------------------------
def _runtime(side):
    if side == "deepspeed":
        import deepspeed
        import deepspeed.ops.random_ltd.dropping_utils as dropping
        from deepspeed.runtime.data_pipeline.data_routing import basic_layer
        from deepspeed.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
        from deepspeed.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler

        dropping.random_ltd_module = _TorchRandomLTDOp()  # its CUDA op cannot load on a CPU
        deepspeed.init_distributed(dist_backend="gloo")
        return deepspeed.initialize, convert_to_random_ltd, RandomLTDScheduler, basic_layer
    import torch.distributed as dist

    import dslaunch
    from dslaunch.runtime.data_pipeline.data_routing import basic_layer
    from dslaunch.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
    from dslaunch.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler

    dist.init_process_group("gloo", rank=0, world_size=1)
    return dslaunch.initialize, convert_to_random_ltd, RandomLTDScheduler, basic_layer


class _TorchRandomLTDOp:
    """DeepSpeed's RandomLTDBuilder op, in torch, for its side only: ``token_sort_`` sorts each
    row of the ``[layers, batch, kept]`` positions, ``token_gather`` takes the kept tokens,
    ``token_scatter_`` writes them back in place."""

    @staticmethod
    def token_sort_(indices, seq_length):
        indices.copy_(indices.sort(dim=-1).values)
        return indices

    @staticmethod
    def _index(indices, like, batch_first):
        idx = indices.long() if batch_first else indices.long().t()
        return idx.unsqueeze(-1).expand(*idx.shape, like.size(-1)), 1 if batch_first else 0

    @classmethod
    def token_gather(cls, activations, indices, batch_first):
        idx, dim = cls._index(indices, activations, batch_first)
        return activations.gather(dim, idx)

    @classmethod
    def token_scatter_(cls, all_activations, layer_activations, indices, batch_first):
        idx, dim = cls._index(indices, all_activations, batch_first)
        return all_activations.scatter_(dim, idx, layer_activations)


def side(name: str, io: str, steps: int) -> dict:
    inputs = torch.load(io + ".in", weights_only=True)
    initialize, convert, Scheduler, basic_layer = _runtime(name)
    out = {"schedules": {}}
    for lo, hi, req, per in SCHEDULES:
        sched = Scheduler(dict(section(lo, hi, req, per), global_batch_size=8))
        trace = []
        for step in range(SCHEDULE_STEPS):
            sched.update_seq(step)
            sched.update_seq(step)
            trace.append(dict(sched.state_dict()))
        total = Scheduler(dict(section(lo, hi, req, per), global_batch_size=8))
        out["schedules"][f"{lo}-{hi}-{req}-{per}"] = {
            "trace": trace, "total": total.get_total_layer_tokens(SCHEDULE_STEPS)}

    def bound(model):
        return {n: m.random_ltd_layer_id for n, m in model.named_modules()
                if isinstance(m, basic_layer.RandomLayerTokenDrop)
                and m.random_ltd_scheduler is not None}

    model = Stack()
    model.load_state_dict(inputs["weights"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = initialize(model=model, optimizer=opt, config=config(section()))
    convert(engine, Block)
    out["bound"] = bound(model)
    seen: dict = {}
    for name, m in model.named_modules():
        if isinstance(m, Block):
            m.register_forward_pre_hook(
                lambda mod, args, kwargs, name=name: seen.setdefault(name, []).append(
                    [list(args[0].shape), list(kwargs["attention_mask"].shape)]),
                with_kwargs=True)
    out["steps"] = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = engine(inputs["x"][step], attention_mask=inputs["mask"])
        engine.backward(loss)
        grad = model.h[1].random_ltd_layer.qkv.weight.grad.clone()
        engine.step()
        state = engine.random_ltd_scheduler.state
        kept = state.get("sample_idx")
        out["steps"].append({"loss": loss.item(), "grad_h1": grad,
                             "state": dict(engine.random_ltd_scheduler.state_dict()),
                             "kept": kept.long() if kept is not None and
                             engine.random_ltd_scheduler.get_current_seq() < SEQ else None})
    out["shapes_seen"] = seen

    prefixed = Prefixed()
    engine2, *_ = initialize(model=prefixed, optimizer=torch.optim.SGD(prefixed.parameters(), lr=0.1),
                             config=config(section(ids=(2, 3))))
    convert(engine2, Block)
    out["bound_under_gpt2_prefix"] = bound(prefixed)
    try:
        Stack_ = Stack()
        engine3, *_ = initialize(model=Stack_, optimizer=torch.optim.SGD(Stack_.parameters(), lr=0.1),
                                 config=config(section(lr=True)))
        convert(engine3, Block)
        out["layer_token_lr"] = "accepted"
    except Exception as exc:  # DeepSpeed: "not yet support" / NotImplementedError
        out["layer_token_lr"] = f"refused: {type(exc).__name__}: {exc}"[:120]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", help="the DeepSpeed 0.19.8 venv's python (default: "
                        "benchmarks/peers.py's)")
    parser.add_argument("--side", choices=["dslaunch", "deepspeed"])
    parser.add_argument("--io")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    if args.side:
        torch.save(side(args.side, args.io, args.steps), f"{args.io}.{args.side}")
        return
    peer = args.peer
    if peer is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from peers import peer_python

        peer = peer_python(create=True)
    peer = os.path.abspath(peer)
    torch.manual_seed(0)
    weights = Stack().state_dict()
    inputs = {"weights": weights, "x": torch.randn(args.steps, BATCH, SEQ, WIDTH),
              "mask": causal_mask()}
    with tempfile.TemporaryDirectory() as tmp:
        io = os.path.join(tmp, "rltd")
        torch.save(inputs, io + ".in")
        results = {}
        for name, python in (("deepspeed", peer), ("dslaunch", sys.executable)):
            env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                       OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
            subprocess.run([python, os.path.abspath(__file__), "--side", name, "--io", io,
                            "--steps", str(args.steps)], check=True, cwd=tmp, env=env,
                           stdout=subprocess.DEVNULL)
            results[name] = torch.load(f"{io}.{name}", weights_only=True)
    report = compare(results["deepspeed"], results["dslaunch"])
    line = json.dumps(report)
    print(line)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       time.strftime("random_ltd_ds-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        f.write(line + "\n")


def compare(ds: dict, ours: dict) -> dict:
    report = {"schedules_equal": ds["schedules"] == ours["schedules"],
              "schedules": list(ds["schedules"]),
              "bound_equal": ds["bound"] == ours["bound"], "bound": ours["bound"],
              "scheduler_states_equal": [a["state"] for a in ds["steps"]]
              == [b["state"] for b in ours["steps"]],
              "kept_positions_equal": all(
                  (a["kept"] is None and b["kept"] is None)
                  or (a["kept"] is not None and b["kept"] is not None
                      and torch.equal(a["kept"], b["kept"]))
                  for a, b in zip(ds["steps"], ours["steps"])),
              "steps_with_dropping": sum(a["kept"] is not None for a in ds["steps"]),
              "shapes_seen_equal": ds["shapes_seen"] == ours["shapes_seen"],
              "max_loss_diff": max(abs(a["loss"] - b["loss"])
                                   for a, b in zip(ds["steps"], ours["steps"])),
              "max_grad_diff": max((a["grad_h1"] - b["grad_h1"]).abs().max().item()
                                   for a, b in zip(ds["steps"], ours["steps"])),
              "bound_under_gpt2_prefix": {"deepspeed": ds["bound_under_gpt2_prefix"],
                                          "dslaunch": ours["bound_under_gpt2_prefix"]},
              "layer_token_lr": {"deepspeed": ds["layer_token_lr"],
                                 "dslaunch": ours["layer_token_lr"]}}
    return report


if __name__ == "__main__":
    main()
