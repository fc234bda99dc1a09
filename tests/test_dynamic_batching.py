"""Dynamic batching (DeepSpeed's ``data_sampling.variable_batch_size_and_lr``; ours:
engine/features/data_efficiency/variable_batch.py): the packing's token budget, sample counts and orders,
the LR scaling methods, the scheduler's state, the config's keys, and the ``_deepspeed`` helper on
a one-process dslaunch engine. Identity with DeepSpeed's own functions:
benchmarks/compare_dynamic_batching_ds.py (outside CI)."""

import math
import random
import warnings

import pytest
import torch

import dslaunch
from dslaunch.config import ConfigError, resolve_config
from dslaunch.config.data_efficiency import data_efficiency_problems
from dslaunch.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import (
    VariableBatchSizeLR,
    batch_by_seqlens,
    dataloader_for_variable_batch_size,
    get_dataloader_and_lr_scheduler_for_variable_batch_size,
    get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed,
    lr_scheduler_for_variable_batch_size,
    scale_lr,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's scheduler-order notes

LENS = [(i * 7) % 30 + 1 for i in range(60)]  # 1..30, scrambled


def _check_packing(ids, sizes, max_lens, lens, max_tokens, eff, lo=1, hi=None):
    assert len(ids) % eff == 0 and len(sizes) == len(max_lens) == len(ids) // eff
    seen = [i for _, mb in ids for i in mb]
    assert len(seen) == len(set(seen))  # a sample at most once
    for j, (batch, mb) in enumerate(ids):
        assert batch == j // eff
        assert lo <= len(mb) and (hi is None or len(mb) <= hi)
        assert sum(lens[i] for i in mb) <= max_tokens
    for b in range(len(sizes)):
        mbs = [mb for batch, mb in ids if batch == b]
        assert sizes[b] == sum(len(mb) for mb in mbs)
        assert max_lens[b] == max(lens[i] for mb in mbs for i in mb)
    return seen


def test_a_small_case_by_hand():
    # from each start the longest run within the budget; DeepSpeed's range never takes the last
    ids, sizes, max_lens = batch_by_seqlens([3, 3, 3, 3, 3], max_tokens=6)
    assert ids == [(0, [0, 1]), (1, [2, 3])] and sizes == [2, 2] and max_lens == [3, 3]
    # a sample over the budget is dropped; with min_batch_size 2 nothing fits from the 10 on
    # ([10] too few, [10, 5] too many tokens): the packing ends there
    ids, _, _ = batch_by_seqlens([2, 50, 2, 10, 5, 1, 1], max_tokens=12, min_batch_size=2)
    assert ids == [(0, [0, 2])]
    assert batch_by_seqlens([4, 4, 4, 4, 4, 4], max_tokens=100, max_batch_size=2)[0] == \
        [(0, [0, 1]), (1, [2, 3]), (2, [4])]


@pytest.mark.parametrize("order", ["dataloader", "seqlen", "random"])
def test_packing_respects_budget_counts_and_order(order):
    # 60 tokens: any two samples fit, so min_batch_size 2 never ends the packing early
    ids, sizes, max_lens = batch_by_seqlens(LENS, max_tokens=60, min_batch_size=2,
                                            max_batch_size=4, sequence_picking_order=order,
                                            effective_batch_size=3, seed=5)
    seen = _check_packing(ids, sizes, max_lens, LENS, 60, 3, lo=2, hi=4)
    assert len(seen) > 50
    if order == "dataloader":
        assert seen == list(range(len(seen)))  # the given order, a prefix of the data
    if order == "seqlen":
        assert [LENS[i] for i in seen] == sorted(LENS[i] for i in seen)
    if order == "random":
        again = batch_by_seqlens(LENS, 60, None, 2, 4, "random", 3, seed=5)[0]
        other = batch_by_seqlens(LENS, 60, None, 2, 4, "random", 3, seed=6)[0]
        assert again == ids and other != ids
        order_of = list(zip(LENS, range(len(LENS))))
        random.Random(5).shuffle(order_of)
        assert seen == [i for _, i in order_of][:len(seen)]


def test_equal_size_microbatches_and_filter_ids():
    ids, sizes, max_lens = batch_by_seqlens(LENS, max_tokens=60, effective_batch_size=4,
                                            required_microbatches_of_same_size=True)
    _check_packing(ids, sizes, max_lens, LENS, 60, 4)
    for b in range(len(sizes)):
        assert len({len(mb) for batch, mb in ids if batch == b}) == 1
        assert sizes[b] % 4 == 0
    picked = list(range(0, 60, 3))
    ids, sizes, max_lens = batch_by_seqlens(LENS, max_tokens=40, sequence_ids_per_mb=picked)
    seen = _check_packing(ids, sizes, max_lens, LENS, 40, 1)
    assert set(seen) <= set(picked)
    with pytest.raises(AssertionError):
        batch_by_seqlens([5, 5], max_tokens=10, effective_batch_size=4)


def test_lr_scaling_methods():
    assert scale_lr(8, 4, 0.1, "linear") == pytest.approx(0.05)
    assert scale_lr(8, 32, 0.1, "sqrt") == pytest.approx(0.2)
    assert scale_lr(8, 2, 0.1, None) == scale_lr(8, 2, 0.1, "NONE") == scale_lr(8, 2, 0.1, "none")
    assert scale_lr(8, 16) == 2
    with pytest.raises(ValueError, match="Unknown scaling method"):
        scale_lr(8, 2, 0.1, "cubic")


def _sgd(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


@pytest.mark.parametrize("method", ["linear", "sqrt", "none"])
def test_scheduler_scales_each_batch_over_a_constant_lr(method):
    opt = _sgd()
    sizes = [4, 8, 2]
    sched = lr_scheduler_for_variable_batch_size(4, sizes, None, opt, lr_scaling_method=method)
    assert isinstance(sched, VariableBatchSizeLR) and sched.optimizer is opt
    for step in range(7):  # the sizes cycle
        assert sched.get_lr() == [pytest.approx(scale_lr(4, sizes[step % 3], 0.1, method))]
        assert sched.last_epoch == step
        opt.step()
        sched.step()


def test_scheduler_over_a_torch_scheduler_and_its_state_round_trip():
    def make():
        opt = _sgd(1.0)
        base = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return opt, lr_scheduler_for_variable_batch_size(2, [2, 4, 1], None, base)

    opt, sched = make()
    lrs = []
    for _ in range(5):
        lrs.append(sched.get_lr()[0])
        opt.step()
        sched.step()
    unscaled = [1.0, 1.0, 0.5, 0.5, 0.25]
    assert lrs == [pytest.approx(u * s / 2) for u, s in zip(unscaled, [2, 4, 1, 2, 4])]
    state = sched.state_dict()
    assert set(state) == {"base_lr_scheduler", "base_batch_size", "lr_scaling_method",
                          "batch_sizes", "base_lrs", "last_epoch", "verbose"}
    assert state["last_epoch"] == 5 and state["batch_sizes"] == [2, 4, 1]
    opt2, sched2 = make()
    sched2.load_state_dict(state)
    for group in opt2.param_groups:  # a resume also restores the optimizer's (scaled) LRs
        group["lr"] = opt.param_groups[0]["lr"]
    for _ in range(3):
        opt.step()
        opt2.step()
        sched.step()
        sched2.step()
        assert sched2.get_lr() == sched.get_lr()
        assert sched2.get_last_lr() == sched.get_last_lr()


def test_dataloader_splits_microbatches_and_pads():
    data = [list(range(n)) for n in LENS]
    ids, sizes, max_lens = batch_by_seqlens(LENS, max_tokens=45, effective_batch_size=2)
    per_rank = []
    for rank in range(2):
        loader, kwargs = dataloader_for_variable_batch_size(
            data, ids, max_lens, dataloader_rank=rank, dataloader_num_replicas=2,
            dataloader_num_workers=0, required_microbatches_of_same_seqlen=True,
            sample_padding_fn=lambda s, n: s + [-1] * (n - len(s)))
        assert set(kwargs) == {"dataset", "batch_size", "pin_memory", "data_sampler",
                               "collate_fn", "num_local_io_workers"}
        per_rank.append(list(loader))
    for j, (batch, mb) in enumerate(ids):  # micro-batch j goes to rank j % 2
        samples = per_rank[j % 2][j // 2]
        assert [s[:LENS[i]] for s, i in zip(samples, mb)] == [data[i] for i in mb]
        assert all(len(s) == max_lens[batch] for s in samples)


def test_config_keys_are_checked_and_enabled_is_accepted():
    def section(**dynamic):
        return {"data_sampling": {"dynamic_batching": dynamic}}

    assert data_efficiency_problems(section(enabled=True, max_tokens=100)) == []
    assert [p.split(":")[0] for p in data_efficiency_problems(section(
        enabled=True, lr_scaling_method="cubic", sequence_picking_order="len",
        min_batch_size=0, max_batch_size="x", metrics_path=3, verbose="y", extra=1))] == [
        f"data_efficiency.data_sampling.dynamic_batching.{k}" for k in (
            "extra", "verbose", "lr_scaling_method", "sequence_picking_order", "min_batch_size",
            "max_batch_size", "metrics_path", "max_tokens")]
    base = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}
    resolve_config({**base, "data_efficiency": section(enabled=True, max_tokens=64)},
                   world_size=2)
    with pytest.raises(ConfigError, match="dynamic_batching.max_batch_size: 1 is below"):
        resolve_config({**base, "data_efficiency": section(enabled=True, max_tokens=64,
                                                           min_batch_size=2, max_batch_size=1)},
                       world_size=2)


def _engine(dynamic, scheduler=None, seed=7):
    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "steps_per_print": 1000,
           "data_efficiency": {"seed": seed, "data_sampling": {"dynamic_batching": dynamic}}}
    if scheduler:
        cfg["scheduler"] = scheduler
    engine, *_ = dslaunch.initialize(model=torch.nn.Linear(3, 1), config=cfg)
    return engine


def test_the_deepspeed_helper_on_a_dslaunch_engine():
    dynamic = {"enabled": True, "max_tokens": 40, "lr_scaling_method": "sqrt",
               "sequence_picking_order": "random", "max_batch_size": 3}
    engine = _engine(dynamic)
    data = [torch.full((n,), float(i)) for i, n in enumerate(LENS)]
    loader, sched, _ = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        data, engine, dataset_seqlens=LENS)
    # what the plain call gives for the engine's numbers (train batch 4, micro batch 2, seed 7)
    ids, sizes, _ = batch_by_seqlens(LENS, 40, None, 1, 3, "random", 4, seed=7)
    assert sched.batch_sizes == sizes
    items = list(loader)
    assert len(items) == len(ids) // 2  # items of 2 micro-batches, one rank
    _, _, io_kwargs = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        data, engine, dataset_seqlens=LENS)
    io_items = list(engine.deepspeed_io(**io_kwargs))  # DeepSpeed's way to the same loader
    assert [[s.tolist() for s in item] for item in io_items] == \
        [[s.tolist() for s in item] for item in items]
    for k, item in enumerate(items):
        expected = [i for _, mb in ids[2 * k:2 * k + 2] for i in mb]
        assert [int(s[0]) for s in item] == expected
    for step in range(4):  # one batch = gas (2) loader items; its LR is scaled by its size
        assert engine.optimizer.param_groups[0]["lr"] == \
            pytest.approx(0.1 * math.sqrt(sizes[step] / 4))
        for item in items[2 * step:2 * step + 2]:
            x = torch.stack([s[:1].expand(3) for s in item])
            engine.backward(engine(x).sum())
        engine.step()
        sched.step()


def test_the_deepspeed_helper_over_the_engine_scheduler_and_without_the_flag():
    engine = _engine({"enabled": True, "max_tokens": 50},
                     scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
                                                               "warmup_max_lr": 0.1,
                                                               "warmup_num_steps": 4}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, sched, _ = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
            list(range(60)), engine, dataset_seqlens=LENS)
    assert sched.base_lr_scheduler is engine.lr_scheduler
    with pytest.raises(AssertionError, match="not enabled"):
        get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
            list(range(60)), _engine({"enabled": False}), dataset_seqlens=LENS)


def test_plain_call_returns_loader_scheduler_and_io_kwargs():
    loader, sched, kwargs = get_dataloader_and_lr_scheduler_for_variable_batch_size(
        list(range(60)), LENS, max_tokens=30, effective_batch_size=2,
        lr_scheduler_or_optimizer=_sgd(), dataloader_batch_size=2)
    assert kwargs["batch_size"] == 2 and sched.dataloader is loader
    assert sched.get_lr() == [pytest.approx(0.1 * sched.batch_sizes[0] / 2)]


def test_the_deepspeed_helper_writes_and_reads_the_analyzer_seqlen_files(tmp_path):
    dynamic = {"enabled": True, "max_tokens": 40, "metrics_path": str(tmp_path / "metrics")}
    engine = _engine(dynamic)
    data = [torch.tensor([n, i]) for i, n in enumerate(LENS)]  # (length, id) rows
    first = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        data, engine, batch_seqlens_fn=lambda batch: batch[:, 0].clone())
    assert (tmp_path / "metrics" / "seqlen" / "seqlen_sample_to_metric.bin").exists()
    again = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(data, engine)
    given = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        data, engine, dataset_seqlens=LENS)
    assert first[1].batch_sizes == again[1].batch_sizes == given[1].batch_sizes
    assert [[r.tolist() for r in item] for item in again[0]] == \
        [[r.tolist() for r in item] for item in given[0]]
