"""Rank script for tests/test_engine_surface.py: DeepSpeed's engine members on real ranks.

``--mode`` picks what runs; every rank writes what it saw to ``--out/rank_{r}.json``:

- ``patterns``: for ZeRO stages 0-3 the two step() call patterns frameworks use, each on a fresh
  engine over the same data: (a) step() after every backward, the engine counting micro-steps;
  (b) Accelerate's: set_gradient_accumulation_boundary() before each backward, step() only at
  boundaries, non-boundary micro-steps inside no_sync() (stages 0-1); (c) Transformers': (b) with
  the loss divided by the caller and backward(loss, scale_wrt_gas=False). Also what no_sync()
  refuses, and the all-reduce calls made inside it.
- ``fp16``: an inf gradient at step 1: was_step_applied() and optimizer.overflow / cur_scale.
- ``forward_only``: engines without an optimizer (stage 0 and 3) next to a trained one.
- ``zero3``: the ds_* attributes of stage 3 and their status through forward, gather, release.
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dslaunch
from dslaunch.runtime.zero.partition_parameters import ZeroParamStatus
from examples.gpt import GPT, GPTConfig, TextBatches, stdlib_bytes

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True)
ap.add_argument("--out", required=True)
a, _ = ap.parse_known_args()

STEPS, GAS = 3, 2
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}
DATA = stdlib_bytes(1 << 18)


def config(stage, optimizer=True, zero=None, **extra):
    c = {"train_batch_size": 8, "gradient_accumulation_steps": GAS, "gradient_clipping": 0.5,
         "steps_per_print": 1000,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000,
                               "stage3_param_persistence_threshold": 0,
                               "stage3_max_reuse_distance": 0, **(zero or {})}}
    if optimizer:
        c["optimizer"] = ADAMW
    c.update(extra)
    return c


def model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(seq_len=16, n_layer=1, d_model=32, n_head=2))


def micro_batches(engine, step):
    tokens, targets = TextBatches(DATA, seq_len=16, global_batch=engine.train_batch_size()) \
        .batch_at(step, dist.get_rank(), dist.get_world_size())
    mb = engine.train_micro_batch_size_per_gpu()
    return [(tokens[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb]) for i in range(GAS)]


def collective_calls(engine) -> int:
    return sum(rec["calls"] for rec in engine.comm_stats().values())


def train(engine, pattern):
    """Per-step losses (this rank's micro-batch losses, exact) under a call pattern."""
    losses, no_sync_calls, boundary_calls = [], [], []
    for step in range(STEPS):
        for i, (x, y) in enumerate(micro_batches(engine, step)):
            boundary = i == GAS - 1
            if pattern == "a":
                loss = engine(x, y)
                engine.backward(loss)
                engine.step()
            else:
                engine.set_gradient_accumulation_boundary(is_boundary=boundary)
                quiet = engine.no_sync() if not boundary and engine.zero_stage < 2 else None
                before = collective_calls(engine)
                with quiet if quiet is not None else contextlib.nullcontext():
                    loss = engine(x, y)
                    if pattern == "b":
                        engine.backward(loss)
                    else:  # the caller divides (Transformers' Trainer)
                        engine.backward(loss / GAS, scale_wrt_gas=False)
                calls = collective_calls(engine) - before
                (no_sync_calls if quiet is not None else boundary_calls).append(calls)
                if boundary:
                    engine.step()
            losses.append(loss.item())
    return {"losses": losses, "global_steps": engine.global_steps, "no_sync_calls": no_sync_calls,
            "boundary_calls": boundary_calls, "applied": engine.was_step_applied()}


def refusals(engine) -> list:
    """What no_sync() refuses on this engine, as exception type names."""
    out = []
    try:
        with engine.no_sync():
            x, y = micro_batches(engine, 0)[0]
            engine.set_gradient_accumulation_boundary(False)
            engine.backward(engine(x, y))
            try:
                engine.step()
            except AssertionError:
                out.append("step")
            engine.set_gradient_accumulation_boundary(True)
            try:
                engine.backward(engine(x, y))
            except AssertionError:
                out.append("boundary_backward")
    except AssertionError:
        out.append("no_sync")
    return out


def mode_patterns():
    out = {}
    for stage in (0, 1, 2, 3):
        for pattern in ("a", "b", "c"):
            engine, *_ = dslaunch.initialize(model=model(), config=config(stage))
            out[f"{stage}{pattern}"] = train(engine, pattern)
        out[f"refused{stage}"] = refusals(engine)
    return out


def mode_fp16():
    cfg = config(0, fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1})
    engine, optimizer, *_ = dslaunch.initialize(model=model(), config=cfg)
    seen = {"before": [engine.was_step_applied(), optimizer.overflow, optimizer.cur_scale]}
    for step in range(3):
        for i, (x, y) in enumerate(micro_batches(engine, step)):
            engine.backward(engine(x, y))
            if step == 1 and i == GAS - 1:  # overflowing gradients (reduced already)
                engine.optimizer.param_groups[0]["params"][0].grad.fill_(float("inf"))
            engine.step()
        seen[step] = [engine.was_step_applied(), optimizer.overflow, optimizer.cur_scale,
                      optimizer.loss_scale]
    return seen


def status_of(params) -> list:
    params = list(params)
    assert all(isinstance(p.ds_status, ZeroParamStatus) for p in params)
    return [p.ds_status.name for p in params]


def mode_forward_only():
    out = {}
    tokens = micro_batches_for_world()
    plain = model(1)
    with torch.no_grad():
        want = plain(tokens)
    for stage in (0, 3):
        engine, optimizer, _, scheduler = dslaunch.initialize(
            model=model(1), config=config(stage, optimizer=False,
                                          scheduler={"type": "WarmupLR", "params": {}}))
        engine.eval()
        # DeepSpeed's: None under stages 0-2, the parameter-offload object under stage 3
        r = {"optimizer": (optimizer is None) == (stage == 0) and scheduler is None}
        seen = []
        if stage == 3:
            params = list(engine.module.parameters())
            r["before"] = status_of(params)
            hook = engine.module.head.register_forward_pre_hook(
                lambda m, args, seen=seen: seen.append(status_of(m.parameters(recurse=False))))
        with torch.no_grad():
            got = engine(tokens)
        r["same_output"] = torch.equal(got, want)
        if stage == 3:
            hook.remove()
            r["inside"], r["after"] = seen, status_of(params)
            sd = engine._zero3_consolidated_16bit_state_dict()
            r["state_dict_equal"] = (dist.get_rank() != 0 or all(
                torch.equal(sd[k], v) for k, v in plain.state_dict().items())) and \
                len(sd) == (len(plain.state_dict()) if dist.get_rank() == 0 else 0)
        for call in ("backward", "step"):
            try:
                engine.backward(got.sum()) if call == "backward" else engine.step()
            except RuntimeError as e:
                r[f"{call}_refused"] = "without an optimizer" in str(e)
        out[stage] = r
    out["side_by_side"] = side_by_side()
    return out


def micro_batches_for_world():
    torch.manual_seed(7)
    return torch.randint(0, 256, (2, 16))


def side_by_side():
    """A policy trained (stage 1) next to a frozen reference (stage 3, no optimizer): the
    policy's losses equal those of the policy trained alone; the reference's outputs never
    change and equal the plain model's."""
    tokens = micro_batches_for_world()
    with torch.no_grad():
        want = model(1)(tokens)
    alone, *_ = dslaunch.initialize(model=model(), config=config(1))
    solo = train(alone, "a")["losses"]
    policy, *_ = dslaunch.initialize(model=model(), config=config(1))
    ref, *_ = dslaunch.initialize(model=model(1), config=config(3, optimizer=False))
    ref.eval()
    losses, ref_same = [], []
    for step in range(STEPS):
        for x, y in micro_batches(policy, step):
            with torch.no_grad():
                ref_same.append(torch.equal(ref(tokens), want))
            loss = policy(x, y)
            policy.backward(loss)
            policy.step()
            losses.append(loss.item())
    return {"policy_equal": losses == solo, "ref_same": ref_same}


def mode_zero3():
    engine, *_ = dslaunch.initialize(model=model(), config=config(3))
    params = list(engine.module.parameters())
    r = {"ids_unique": len({p.ds_id for p in params}) == len(params),
         "shapes": all(p.ds_shape == p.shape and p.ds_numel == p.numel() for p in params),
         "before": status_of(params)}
    held = torch.tensor([p.partition_numel() for p in params])
    dist.all_reduce(held)
    r["partitions_cover"] = held.tolist() == [p.ds_numel for p in params]
    head = engine.module.head.weight
    pieces = [None] * dist.get_world_size()  # every rank's ds_tensor, in rank order
    dist.all_gather_object(pieces, head.ds_tensor.tolist())
    with dslaunch.zero.GatheredParameters(head):
        r["gathered"] = head.ds_status.name
        whole = [x for piece in pieces for x in piece]
        r["pieces_make_the_whole"] = whole == head.detach().reshape(-1).tolist()
    r["released"] = head.ds_status.name
    seen = []
    engine.module.blocks[0].ln1.register_forward_pre_hook(
        lambda m, args: seen.append(status_of(m.parameters(recurse=False))))
    x, y = micro_batches(engine, 0)[0]
    loss = engine(x, y)
    r["inside_forward"] = seen[-1]
    engine.backward(loss)
    r["after_backward"] = sorted(set(status_of(params)))
    return r | empty_cache()


def empty_cache() -> dict:
    """With DeepSpeed's default reuse distance a training forward (on the recorded order)
    keeps units gathered for backward: empty_partition_cache() releases them, and backward
    gathers them again."""
    engine, *_ = dslaunch.initialize(model=model(), config=config(
        3, zero={"stage3_max_reuse_distance": 10**9}))
    params = list(engine.module.parameters())
    r, seen = {}, []
    engine.module.blocks[0].ln1.register_forward_pre_hook(
        lambda m, args: seen.append(sorted(set(status_of(params)))))
    for step in range(2):
        x, y = micro_batches(engine, step)[0]
        loss = engine(x, y)
        r[f"seen_in_forward_{step}"] = seen[-1]  # the second one prefetches along the order
        if step == 1:
            r["kept"] = sorted(set(status_of(params)))
            engine.empty_partition_cache()
            r["emptied"] = sorted(set(status_of(params)))
        engine.set_gradient_accumulation_boundary(True)
        engine.backward(loss)
        engine.step()
    r["trained_after_emptying"] = engine.global_steps == 2 and engine.was_step_applied()
    return r


MODES = {"patterns": mode_patterns, "fp16": mode_fp16, "forward_only": mode_forward_only,
         "zero3": mode_zero3}
dslaunch.init_distributed()
result = MODES[a.mode]()
Path(a.out).mkdir(parents=True, exist_ok=True)
(Path(a.out) / f"rank_{dist.get_rank()}.json").write_text(json.dumps(result, default=str))
