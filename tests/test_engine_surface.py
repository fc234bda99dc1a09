"""DeepSpeed's engine surface beyond the loop (dslaunch/engine/core/deepspeed_surface.py, the
forward-only strategies, the ZeRO-3 ds_* attributes): in this process (world size 1), then on 2
real ranks through `dslaunch run` (tests/scripts/surface_train.py)."""

import argparse
import inspect
import sys

import pytest
import torch

from helpers import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import dslaunch
from dslaunch.engine.core.deepspeed_surface import EngineDestroyedError
from dslaunch.engine.zero.no_optimizer import NoOptimizerError
from dslaunch.engine.zero.param_offload import ZeroParamOffload
from gpt import GPT, GPTConfig

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))


def _engine(stage=0, optimizer=ADAMW, model=None, **extra):
    cfg = {"train_batch_size": 4, "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": stage}, **extra}
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    engine, *_ = dslaunch.initialize(model=model or _model(), config=cfg)
    return engine


def _train(engine, steps=1):
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(steps * engine.gradient_accumulation_steps()):
        engine.backward(engine(tok, tok))
        engine.step()


# -- in this process ------------------------------------------------------------------------------

def test_config_is_the_resolved_dict_and_the_accessors_answer():
    e = _engine(bf16={"enabled": True}, wall_clock_breakdown=False,
                zero_optimization={"stage": 1, "stage3_gather_16bit_weights_on_model_save": True})
    assert isinstance(e.config, dict)  # Transformers: engine.config.get(...).get("stage")
    assert e.config.get("zero_optimization", {}).get("stage") == 1
    assert e.config["train_micro_batch_size_per_gpu"] == 2  # resolved, not as written
    assert e._config.zero_optimization.stage == 1  # the typed one
    assert (e.bfloat16_enabled(), e.fp16_enabled()) == (True, False)
    assert (e.zero_optimization(), e.zero_optimization_stage()) == (True, 1)
    assert e.zero_gather_16bit_weights_on_model_save() is True
    assert e.wall_clock_breakdown() is False
    assert e.optimizer_name() == "adamw" and e.get_mom() == [(0.9, 0.999)]
    assert e.mp_world_size == 1
    assert e.get_data_parallel_group() is e.data_parallel_group is not None
    assert (e.get_data_parallel_rank(), e.get_model_parallel_rank(),
            e.get_tensor_parallel_rank()) == (0, 0, 0)
    e.set_train_batch_size(8)
    assert (e.train_batch_size(), e.gradient_accumulation_steps()) == (8, 4)
    assert e.config["gradient_accumulation_steps"] == 4
    with pytest.raises(ValueError, match="not a multiple of micro-batch 2"):
        e.set_train_batch_size(5)
    e.set_train_micro_batch_size(3)  # the accumulation steps stay (DeepSpeed's rule)
    assert (e.train_micro_batch_size_per_gpu(), e.gradient_accumulation_steps(),
            e.train_batch_size()) == (3, 4, 12)
    assert e.config["train_batch_size"] == 12


@pytest.mark.parametrize("stage", [0, 3])
def test_both_step_call_patterns_on_one_rank(stage):
    """step() after every backward == Accelerate's boundary flag with step() at boundaries."""
    toks = [torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(i))
            for i in range(6)]
    losses = {}
    for pattern in ("every", "boundary"):
        e = _engine(stage)
        losses[pattern] = []
        for i, tok in enumerate(toks):
            boundary = i % 2 == 1
            if pattern == "boundary":
                e.set_gradient_accumulation_boundary(is_boundary=boundary)
            loss = e(tok, tok)
            e.backward(loss)
            if pattern == "every" or boundary:
                e.step()
            losses[pattern].append(loss.item())
        assert e.global_steps == 3
    assert losses["every"] == losses["boundary"]


def test_user_optimizer_name_and_momentum():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    engine, returned, _, _ = dslaunch.initialize(model=model, optimizer=opt,
                                                 config={"train_batch_size": 2})
    assert engine.optimizer_name() == "SGD" and engine.get_mom() == [0.5]
    assert returned is opt and not engine.zero_optimization()


def test_unknown_attributes_come_from_the_module():
    model = _model()
    e = _engine(model=model)
    assert e.num_params() == model.num_params()  # a method of the model
    assert e.cfg is model.cfg and e.head is model.head  # an attribute, a submodule
    assert e.module is model and e.training is True  # the engine's own stay its own
    assert list(e.state_dict())[0].startswith("module.")  # nn.Module behaviour intact
    e.tag = "mine"  # setting stays on the engine
    assert e.tag == "mine" and not hasattr(model, "tag")
    assert not hasattr(e, "nonexistent")
    with pytest.raises(AttributeError, match="'DSLaunchEngine' object has no attribute "
                                             "'nonexistent' \\(nor has its module, a GPT\\)"):
        _ = e.nonexistent
    bare = type(e).__new__(type(e))  # before __init__ ran (unpickling, copying)
    with pytest.raises(AttributeError):  # not a RecursionError
        _ = bare.module


def test_compile_compiles_the_module_as_accelerate_calls_it():
    """engine.compile(backend=, compile_kwargs=) (Accelerate's call) compiles the wrapped module
    once; its forward gives the uncompiled engine's loss, and training goes through it."""
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    plain = _engine()
    engine = _engine()
    assert not engine.is_compiled
    engine.compile(backend="eager", compile_kwargs={"dynamic": False})
    assert engine.is_compiled and engine.module._compiled_call_impl is not None
    assert not plain.is_compiled
    assert engine(tok, tok).item() == plain(tok, tok).item()
    _train(engine)
    engine.compile(backend="eager")  # compiled already: nothing more
    with pytest.raises(NotImplementedError, match="DeepCompile"):
        plain.compile(schedule=[(0, [])])


def test_scheduler_needs_a_step_and_the_optimizer_carries_the_loss_scale():
    from dslaunch.runtime.lr_schedules import VALID_LR_SCHEDULES

    model = _model()
    engine, optimizer, _, scheduler = dslaunch.initialize(model=model, config={
        "train_batch_size": 2, "optimizer": ADAMW,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}}})
    assert type(scheduler).__name__ in VALID_LR_SCHEDULES
    with pytest.raises(AssertionError, match="need to call step"):  # Transformers matches it
        scheduler.get_last_lr()
    assert (optimizer.overflow, optimizer.cur_scale, optimizer.loss_scale) == (False, 1.0, 1.0)
    assert not engine.was_step_applied()
    _train(engine)
    assert scheduler.get_last_lr() == engine.get_lr() and engine.was_step_applied()


def test_initialize_takes_dict_args_and_config_params():
    engine, *_ = dslaunch.initialize(args={"local_rank": 0}, model=_model(),
                                     config_params={"train_batch_size": 2, "optimizer": ADAMW})
    assert engine.train_batch_size() == 2 and engine.args == {"local_rank": 0}
    args = argparse.Namespace(deepspeed_config="ds.json", local_rank=0)
    with pytest.raises(ValueError, match="config is given twice, as config= and as "
                                         "args.deepspeed_config"):
        dslaunch.initialize(args=args, model=_model(), config={"train_batch_size": 2})


def test_checkpoint_tags_frozen_parameters_and_nothing_to_load(tmp_path):
    assert "exclude_frozen_parameters" in inspect.signature(_engine().save_checkpoint).parameters
    e = _engine()
    e.module.head.weight.requires_grad_(False)  # after initialize: the optimizer still has it
    _train(e)
    e.save_checkpoint(tmp_path, exclude_frozen_parameters=True)
    assert (tmp_path / "latest").read_text() == "global_step1"
    saved = torch.load(tmp_path / "global_step1" / "model_states.pt", weights_only=True)
    assert "head.weight" not in saved["module"] and "tok_emb.weight" in saved["module"]
    fresh = _engine()
    path, _ = fresh.load_checkpoint(tmp_path, load_module_strict=False)
    assert path.endswith("global_step1") and fresh.global_steps == 1
    with pytest.warns(UserWarning, match="no 'latest' file, nothing loaded"):
        assert _engine().load_checkpoint(tmp_path / "empty") == (None, None)


@pytest.mark.parametrize("stage", [0, 3])
def test_an_engine_without_optimizer_runs_forward_only(stage):
    plain = _model(1)
    engine, optimizer, _, scheduler = dslaunch.initialize(model=_model(1), config={
        "train_batch_size": 2, "zero_optimization": {"stage": stage}})
    assert scheduler is None and engine.optimizer_name() is None
    # DeepSpeed's: None under stages 0-2, the parameter-offload object under stage 3
    assert (optimizer is None) == (stage == 0) and optimizer is engine.optimizer
    if stage == 3:
        assert isinstance(optimizer, ZeroParamOffload) and optimizer.module is engine.module
    tok = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        assert torch.equal(engine(tok), plain(tok))
    loss = engine(tok, tok)
    with pytest.raises(NoOptimizerError, match="built without an optimizer"):
        engine.backward(loss)
    with pytest.raises(NoOptimizerError, match="built without an optimizer"):
        engine.step()
    assert engine.get_lr() == [] and engine.memory_breakdown()["optimizer"] == {}


def test_an_lr_scheduler_without_optimizer_is_refused():
    with pytest.raises(ValueError, match="lr_scheduler= needs an optimizer"):
        dslaunch.initialize(model=_model(), config={"train_batch_size": 2},
                            lr_scheduler=lambda opt: None)


@pytest.mark.parametrize("stage", [0, 3])
def test_destroy_removes_the_hooks_and_retires_the_engine(stage):
    e = _engine(stage)
    _train(e)
    e.destroy()
    hooks = [m._forward_pre_hooks for m in e.module.modules()]
    assert not any(hooks)  # stage 3's gather hooks are gone
    tok = torch.randint(0, 256, (2, 8))
    with pytest.raises(EngineDestroyedError):
        e(tok, tok)
    with pytest.raises(EngineDestroyedError):
        e.memory_breakdown()


def test_16bit_state_dict_of_stage_3_only():
    model = _model()
    want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.pos_emb.weight.requires_grad_(False)
    e = _engine(3, model=model, bf16={"enabled": True})
    full = e._consolidated_16bit_state_dict()
    assert full.keys() == want.keys() and all(torch.equal(full[k], want[k]) for k in want)
    trainable = e._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
    assert set(full) - set(trainable) == {"pos_emb.weight"}
    with pytest.raises(ValueError, match="requires ZeRO stage 3"):
        _engine(0)._zero3_consolidated_16bit_state_dict()


def test_throughput_timer_counts_steps_and_epochs():
    e = _engine()
    assert e.tput_timer.avg_samples_per_sec() == float("-inf")  # nothing past the warm-up
    _train(e, steps=4)
    e.tput_timer.update_epoch_count()
    assert e.tput_timer.global_step_count == 4 and e.tput_timer.epoch_count == 1
    assert e.tput_timer.avg_samples_per_sec() > 0


# -- two ranks ------------------------------------------------------------------------------------

SURFACE_MODES = ("patterns", "fp16", "forward_only", "zero3")


def _run(job_cache, mode):
    """Each rank's record of surface_train.py --mode MODE; the first asked for starts the four
    modes in one launch (JobCache.run_many: one after the other in the same ranks)."""
    cfg = {"train_batch_size": 8, "optimizer": ADAMW}
    job_cache.run_many("surface", "surface_train.py", {
        f"surface_{m}": (("--mode", m, "--out", "{dir}/o"), cfg) for m in SURFACE_MODES},
        timeout=300)
    return job_cache.run(f"surface_{mode}", "surface_train.py", "--mode", mode, "--out",
                         "{dir}/o", config=cfg, timeout=300).results(sub="o")


@pytest.mark.slow
def test_both_step_call_patterns_train_alike_and_no_sync(job_cache):
    """(a) step() after every backward; (b) Accelerate's boundary flag, step() at boundaries,
    no_sync() around the other micro-steps; (c) Transformers' divided loss with
    scale_wrt_gas=False: identical losses, stages 0-3."""
    for r in _run(job_cache, "patterns"):
        for stage in range(4):
            a, b, c = (r[f"{stage}{p}"] for p in "abc")
            assert a["losses"] == b["losses"] == c["losses"], stage
            assert a["global_steps"] == b["global_steps"] == c["global_steps"] == 3
            if stage < 2:  # nothing reduced inside no_sync, the boundary reduces
                assert b["no_sync_calls"] == c["no_sync_calls"] == [0, 0, 0]
                assert all(n > 0 for n in b["boundary_calls"])
                assert r[f"refused{stage}"] == ["step", "boundary_backward"]
            else:
                assert r[f"refused{stage}"] == ["no_sync"]


@pytest.mark.slow
def test_fp16_overflow_is_seen_by_was_step_applied_and_the_optimizer(job_cache):
    for r in _run(job_cache, "fp16"):
        assert r["before"] == [False, False, 256.0]
        assert r["0"] == [True, False, 256.0, 256.0]
        assert r["1"] == [False, True, 128.0, 128.0]  # skipped, scale halved
        assert r["2"] == [True, False, 128.0, 128.0]


@pytest.mark.slow
def test_forward_only_engines_and_two_engines_side_by_side(job_cache):
    for r in _run(job_cache, "forward_only"):
        for stage in ("0", "3"):
            s = r[stage]
            assert s["optimizer"] and s["same_output"], stage
            assert s["backward_refused"] and s["step_refused"], stage
        z3 = r["3"]
        assert set(z3["before"]) == set(z3["after"]) == {"NOT_AVAILABLE"}
        assert z3["inside"] == [["AVAILABLE"]]  # gathered for its module's forward
        assert z3["state_dict_equal"]  # whole on rank 0, {} on rank 1
        assert r["side_by_side"] == {"policy_equal": True, "ref_same": [True] * 6}


@pytest.mark.slow
def test_zero3_parameter_attributes_follow_gather_and_release(job_cache):
    for r in _run(job_cache, "zero3"):
        assert r["ids_unique"] and r["shapes"] and r["partitions_cover"]
        assert set(r["before"]) == {"NOT_AVAILABLE"}
        assert (r["gathered"], r["released"]) == ("AVAILABLE", "NOT_AVAILABLE")
        assert r["pieces_make_the_whole"]  # ds_tensor of ranks 0, 1 in order = the parameter
        assert r["inside_forward"] == ["AVAILABLE", "AVAILABLE"]
        assert r["after_backward"] == ["NOT_AVAILABLE"]
        assert "INFLIGHT" in r["seen_in_forward_1"]  # prefetched along the recorded order
        assert (r["kept"], r["emptied"]) == (["AVAILABLE"], ["NOT_AVAILABLE"])
        assert r["trained_after_emptying"]


def _trl_remove_hooks(offload):
    """What TRL's ``remove_hooks`` does (trl/models/utils.py) to the parameter-offload object."""
    params = [p for _, p in offload.module.named_parameters()]
    params += [p for _, p in offload.module.ds_external_parameters()]
    for p in params:
        p.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


@pytest.mark.parametrize("trains", [False, True])
def test_zero3_parameter_offload_hooks_come_off_and_back_as_trl_does(trains):
    """TRL's unwrap_model_for_generation under ZeRO-3: inside GatheredParameters the hooks are
    removed (the forward runs on the gathered weights without per-module gather/release), then
    put back with _register_deepspeed_module: forwards equal the plain model's throughout."""
    plain = _model(1)
    engine = _engine(3, optimizer=ADAMW if trains else None, model=_model(1))
    offload = engine.optimizer.parameter_offload if trains else engine.optimizer
    tok = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        want = plain(tok)
        hooked = sum(len(m._forward_pre_hooks) for m in engine.module.modules())
        assert hooked > 0 and len(offload.forward_hooks) >= hooked
        with dslaunch.zero.GatheredParameters(list(engine.module.parameters())):
            _trl_remove_hooks(offload)
            assert not any(m._forward_pre_hooks for m in engine.module.modules())
            assert torch.equal(engine.module(tok), want)
            offload._register_deepspeed_module(offload.module)  # TRL's add_hooks
        assert sum(len(m._forward_pre_hooks) for m in engine.module.modules()) == hooked
        assert torch.equal(engine(tok), want)
        offload._register_hooks_recursively(offload.module)  # the old name: no second set
        assert sum(len(m._forward_pre_hooks) for m in engine.module.modules()) == hooked
    if trains:
        _train(engine)  # the hooks that came back gather for training too
        assert torch.isfinite(engine(tok, tok))
