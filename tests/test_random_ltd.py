"""Random layer-wise token dropping (``data_efficiency.data_routing.random_ltd``;
``dslaunch/engine/features/random_ltd/``): the kept length follows the schedule step by step in every
dropping layer, dropped tokens skip the layer unchanged and give its parameters no gradient,
evaluation keeps every token, the layer-token learning rate, the scheduler's resume, the config's
errors, and a two-rank job that saves, resumes and continues with the uninterrupted losses."""

import math
import re

import pytest
import torch
import torch.nn as nn

import dslaunch
from dslaunch.config import ConfigError, resolve_config
from dslaunch.engine.features.random_ltd.convert import (
    remove_random_ltd_state_dict,
    with_random_ltd_names,
)
from dslaunch.engine.features.random_ltd.lr_schedule import layer_token_factor
from dslaunch.ops.random_ltd import (
    GatherTokens,
    ScatterTokens,
    bert_sample_tokens,
    gpt_sample_tokens,
)
from dslaunch.runtime.data_pipeline.data_routing.basic_layer import RandomLayerTokenDrop
from dslaunch.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
from dslaunch.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler
from helpers import ROOT, launch

SEQ, WIDTH, LAYERS = 32, 8, 4


class Block(nn.Module):
    """A per-token residual layer (``x + W x``) that records the sequence lengths it sees."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.seen: list = []

    def forward(self, x, attention_mask=None):
        self.seen.append(x.size(1))
        return x + self.lin(x)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x.pow(2).mean()


def _section(lo=8, hi=SEQ, steps=6, per_step=4, ids=(1, 2), lr=None):
    sec = {"enabled": True, "total_layer_num": LAYERS, "random_ltd_layer_num": len(ids),
           "random_ltd_layer_id": list(ids), "model_mask_name": None, "model_type": "decoder",
           "hidden_state_order": "batch_seq_dim",
           "random_ltd_schedule": {"min_value": lo, "max_value": hi, "schedule_type":
                                   "fixed_linear", "schedule_config": {"require_steps": steps,
                                                                       "seq_per_step": per_step}}}
    if lr is not None:
        sec["layer_token_lr_schedule"] = lr
    return sec


def _config(section, **extra):
    return {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            # as in DeepSpeed, random_ltd.enabled alone switches it on
            "data_efficiency": {"data_routing": {"random_ltd": section}},
            **extra}


def _want(step, lo, hi, steps, per_step):
    """The fixed_linear kept length, written out independently of the scheduler."""
    value = lo + (hi - lo) * step // steps  # exact for these integers
    return min(value - value % per_step, hi)


def test_fixed_linear_values_and_layer_tokens_step_by_step():
    cfg = dict(_section(lo=10, hi=50, steps=7, per_step=3), global_batch_size=4)
    sched = RandomLTDScheduler(cfg)
    tokens = 0
    for step in range(12):
        sched.update_seq(step)
        sched.update_seq(step)  # a second micro-batch of the step books nothing more
        want = _want(step, 10, 50, 7, 3)
        assert sched.get_current_seq() == want, step
        tokens += 4 * (want * 2 + 50 * (LAYERS - 2))
        assert sched.state["consumed_layer_tokens"] == tokens
    assert sched.get_current_seq() == 50


def test_scheduler_state_dict_resumes_the_same_values():
    cfg = dict(_section(lo=4, hi=40, steps=9, per_step=4), global_batch_size=3)
    whole, first = RandomLTDScheduler(cfg), RandomLTDScheduler(cfg)
    for step in range(5):
        whole.update_seq(step)
        first.update_seq(step)
    resumed = RandomLTDScheduler(cfg)
    resumed.load_state_dict(first.state_dict())
    for step in range(5, 14):
        whole.update_seq(step)
        resumed.update_seq(step)
        assert resumed.state_dict() == whole.state_dict()
    with pytest.raises(ValueError, match="consumed_layer_tokens"):
        resumed.load_state_dict({"current_value": 3})


def test_kept_tokens_per_layer_follow_the_schedule(world_of_one):
    torch.manual_seed(0)
    model = Stack()
    engine, *_ = dslaunch.initialize(model=model, config=_config(_section()))
    convert_to_random_ltd(engine, Block)  # DeepSpeed's order: after initialize
    assert engine.random_ltd_enabled()
    blocks = [w.random_ltd_layer for w in model.h]
    for step in range(9):
        loss = engine(torch.randn(2, SEQ, WIDTH))
        engine.backward(loss)
        engine.step()
        kept = _want(step, 8, SEQ, 6, 4)
        assert [b.seen[-1] for b in blocks] == [SEQ, kept, kept, SEQ], step
    engine.eval()
    with torch.no_grad():
        engine(torch.randn(2, SEQ, WIDTH))
    assert [b.seen[-1] for b in blocks] == [SEQ] * LAYERS  # evaluation keeps every token


def test_dropped_tokens_skip_the_layer_and_give_it_no_gradient():
    torch.manual_seed(1)
    block = Block()
    wrapper = RandomLayerTokenDrop(block)
    sched = RandomLTDScheduler(dict(_section(lo=12, ids=(0,)), global_batch_size=2))
    wrapper.init_config(_section(lo=12, ids=(0,)), sched, 0)
    x = torch.randn(2, SEQ, WIDTH, requires_grad=True)
    y = wrapper(x)
    kept = sched.state["sample_idx"][0].long()  # [batch, 12]
    assert kept.shape == (2, 12)
    dropped = torch.ones(2, SEQ, dtype=torch.bool)
    dropped[torch.arange(2).unsqueeze(1), kept] = False
    assert torch.equal(y[dropped], x[dropped])  # unchanged, bit for bit
    expect = x + block.lin(x)
    assert torch.allclose(y[~dropped], expect[~dropped])
    # a loss on dropped tokens only: nothing reaches the layer's parameters
    y[dropped].sum().backward(retain_graph=True)
    assert torch.count_nonzero(block.lin.weight.grad) == 0
    assert torch.count_nonzero(block.lin.bias.grad) == 0
    # a loss on every token: the weight's gradient is the kept tokens' alone (d/dW of sum(Wx))
    block.zero_grad()
    y.sum().backward()
    xk = x.detach()[~dropped]
    assert torch.allclose(block.lin.weight.grad, torch.ones(WIDTH, 1) * xk.sum(0), atol=1e-5)
    assert torch.allclose(block.lin.bias.grad, torch.full((WIDTH,), float(xk.size(0))))
    wrapper.eval()
    assert torch.allclose(wrapper(x), expect)


def test_seq_first_order_and_deepspeeds_gather_scatter_functions():
    torch.manual_seed(2)
    hidden = torch.randn(SEQ, 3, WIDTH, requires_grad=True)  # seq_batch_dim
    idx, mask = gpt_sample_tokens(10, SEQ, 3, layers=2,
                                  attn_mask=torch.tril(torch.ones(3, 1, SEQ, SEQ)))
    assert idx.shape == (2, 3, 10) and idx.dtype == torch.int32
    assert torch.equal(idx, idx.sort(dim=-1).values) and mask.shape == (3, 1, 10, 10)
    lin = nn.Linear(WIDTH, WIDTH)
    full, part = GatherTokens.apply(hidden, idx[1], False)
    out = ScatterTokens.apply(full, lin(part), idx[1], False)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    ds_grad = hidden.grad.clone()
    hidden.grad = None
    plain = hidden.clone()
    rows = idx[1].long().t()  # [kept, batch]
    cols = torch.arange(3).expand_as(rows)
    plain[rows, cols] = lin(hidden[rows, cols])
    assert torch.allclose(out, plain)
    (plain * weights).sum().backward()
    assert torch.allclose(ds_grad, hidden.grad)


def test_encoder_masks_are_each_samples_kept_rows_and_columns():
    torch.manual_seed(3)
    mask = torch.randn(2, 1, SEQ, SEQ)
    idx, masks = bert_sample_tokens(6, SEQ, 2, layers=3, attn_mask=mask)
    assert len(masks) == 3 and masks[0].shape == (2, 1, 6, 6)
    for layer in range(3):
        for b in range(2):
            keep = idx[layer, b].long()
            assert torch.equal(masks[layer][b], mask[b][:, keep][:, :, keep])
    with pytest.raises(ValueError, match="model_mask_name"):
        bert_sample_tokens(6, SEQ, 2)


def test_layers_wrapped_before_initialize_are_bound_by_it(world_of_one):
    model = Stack()
    convert_to_random_ltd(model, Block)  # the bare model: nothing bound yet
    assert all(w.random_ltd_scheduler is None for w in model.h)
    engine, *_ = dslaunch.initialize(model=model, config=_config(_section(ids=(0, 3))))
    assert [w.random_ltd_scheduler is not None for w in model.h] == [True, False, False, True]
    engine.backward(engine(torch.randn(2, SEQ, WIDTH)))
    assert [w.random_ltd_layer.seen[-1] for w in model.h] == [8, SEQ, SEQ, 8]


def test_layer_token_learning_rate(world_of_one):
    lr_cfg = {"enabled": True, "total_layer_tokens": 4000, "warmup_layer_tokens": 1000,
              "warmup_type": "linear"}
    model = Stack()
    engine, opt, *_ = dslaunch.initialize(model=model, config=_config(_section(lr=lr_cfg)))
    convert_to_random_ltd(engine, Block)
    tokens = 0
    for step in range(8):
        engine.backward(engine(torch.randn(2, SEQ, WIDTH)))
        engine.step()
        tokens += 2 * (_want(step, 8, SEQ, 6, 4) * 2 + SEQ * 2)
        assert engine.random_ltd_scheduler.state["consumed_layer_tokens"] == tokens
        warm = tokens / 1000 if tokens < 1000 else max(0.0, (4000 - tokens) / 3000)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * warm, rel=1e-12), step
    assert layer_token_factor(9, 100, 99, "log") == pytest.approx(math.log(10) / math.log(100))


def test_state_dict_names_without_the_wrappers():
    model = Stack()
    plain = model.state_dict()
    convert_to_random_ltd(model, Block)  # a bare model: bound later by initialize
    wrapped = model.state_dict()
    assert "h.1.random_ltd_layer.lin.weight" in wrapped
    assert list(remove_random_ltd_state_dict(wrapped)) == list(plain)
    assert list(with_random_ltd_names(plain, model)) == list(wrapped)


@pytest.mark.parametrize("change, key", [
    (lambda s: s.update(random_ltd_layer_num=3), "random_ltd.random_ltd_layer_num"),
    (lambda s: s.update(random_ltd_layer_id=[1, 9]), "random_ltd.random_ltd_layer_id"),
    (lambda s: s.update(model_type="vit"), "random_ltd.model_type"),
    (lambda s: s["random_ltd_schedule"].update(min_value=64), "random_ltd.random_ltd_schedule.min_value"),
    (lambda s: s["random_ltd_schedule"].update(schedule_type="fixed_root"),
     "random_ltd.random_ltd_schedule.schedule_type"),
    (lambda s: s["random_ltd_schedule"]["schedule_config"].pop("seq_per_step"),
     "random_ltd.random_ltd_schedule.schedule_config.seq_per_step"),
    (lambda s: s.update(layer_token_lr_schedule={"enabled": True}),
     "random_ltd.layer_token_lr_schedule.total_layer_tokens"),
    (lambda s: s.update(hidden_order="x"), "random_ltd.hidden_order"),
])
def test_config_errors_name_the_key(change, key):
    sec = _section()
    change(sec)
    with pytest.raises(ConfigError, match=re.escape("data_efficiency.data_routing." + key)):
        resolve_config(_config(sec), world_size=1)


def test_layer_ids_that_match_no_wrapped_layer_are_refused(world_of_one):
    engine, *_ = dslaunch.initialize(model=Stack(), config=_config(_section()))
    with pytest.raises(ValueError, match="random_ltd_layer_num: 2, but 0 wrapped layers"):
        convert_to_random_ltd(engine, nn.Embedding)  # the model has none


@pytest.mark.slow
def test_two_ranks_save_resume_continue_the_losses(tmp_path):
    cfg = ROOT / "configs" / "data_efficiency_random_ltd.json"
    whole = launch(tmp_path, None, "random_ltd_gpt.py", ["--config", cfg, "--steps", "8"])
    launch(tmp_path, None, "random_ltd_gpt.py",
           ["--config", cfg, "--steps", "4", "--save", tmp_path / "ckpt"])
    resumed = launch(tmp_path, None, "random_ltd_gpt.py",
                     ["--config", cfg, "--steps", "8", "--load", tmp_path / "ckpt"])

    def losses(proc):
        return dict(re.findall(r"LOSS (\d+) (\S+)", proc.stdout))

    def kept(proc):
        return dict(re.findall(r"KEPT (\d+) (\d+)", proc.stdout))

    assert len(losses(whole)) == 8
    later = losses(resumed)
    assert sorted(later) == [str(s) for s in range(4, 8)]
    assert later == {s: v for s, v in losses(whole).items() if int(s) >= 4}
    assert kept(resumed) == {s: v for s, v in kept(whole).items() if int(s) >= 4}
    assert len(set(kept(whole).values())) > 1  # the kept length moved during the run


def test_pipeline_engines_refuse_it(world_of_one):
    from dslaunch.pipe import LayerSpec, PipelineModule

    model = PipelineModule(layers=[LayerSpec(nn.Linear, WIDTH, WIDTH)], num_stages=1,
                           loss_fn=nn.MSELoss())
    with pytest.raises(ValueError, match="random_ltd: not supported with a PipelineModule"):
        dslaunch.initialize(model=model, config=_config(_section()))


def _hf_gpt2_run(attn_implementation):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=LAYERS, n_embd=WIDTH * 4, n_head=2, vocab_size=64,
                                       n_positions=SEQ, attn_implementation=attn_implementation))
    sec = dict(_section(lo=8, steps=4, per_step=8), model_mask_name="attention_mask")
    engine, *_ = dslaunch.initialize(model=model, config=_config(sec))
    engine = convert_to_random_ltd(engine, GPT2Block)  # DeepSpeedExamples' gpt_finetuning way
    masks = []
    for block in model.transformer.h:  # Transformers 5 hands the mask over positionally
        block.random_ltd_layer.register_forward_pre_hook(
            lambda m, args: masks.append(None if args[2] is None else args[2].shape[-1]))
    losses = []
    for _ in range(5):
        tokens = torch.randint(0, 64, (2, SEQ))
        out = engine(tokens, labels=tokens)
        engine.backward(out.loss)
        engine.step()
        losses.append(out.loss.item())
    return losses, masks


def test_hugging_face_gpt2_blocks_get_the_cut_mask(world_of_one):
    pytest.importorskip("transformers")
    eager_losses, eager_masks = _hf_gpt2_run("eager")
    sdpa_losses, sdpa_masks = _hf_gpt2_run("sdpa")
    kept = [_want(step, 8, SEQ, 4, 8) for step in range(5)]
    assert eager_masks == [n for k in kept for n in (SEQ, k, k, SEQ)]  # the mask cut to kept
    assert set(sdpa_masks) == {None}  # sdpa: is_causal on the kept tokens, in order
    assert eager_losses == pytest.approx(sdpa_losses, rel=1e-5)


def test_deepspeeds_per_sample_gather_and_scatter_helpers():
    from dslaunch.runtime.data_pipeline.data_routing.utils import (
        bsh_decoder_gather,
        bsh_decoder_scatter,
    )

    torch.manual_seed(4)
    hidden = torch.randn(3, SEQ, WIDTH)
    part, positions, mask = bsh_decoder_gather(5, hidden, torch.ones(3, 1, SEQ, SEQ))
    assert part.shape == (3, 5, WIDTH) and mask.shape == (3, 1, 5, 5)
    for b, p in enumerate(positions):
        assert torch.equal(p, p.sort().values) and torch.equal(part[b], hidden[b, p])
    out = bsh_decoder_scatter(hidden.clone(), part * 2, positions)
    for b, p in enumerate(positions):
        assert torch.equal(out[b, p], 2 * hidden[b, p])
        others = torch.ones(SEQ, dtype=torch.bool)
        others[p] = False
        assert torch.equal(out[b, others], hidden[b, others])
