"""Rank script: AutoTP (``tensor_parallel.autotp_size``) on tiny Hugging Face Llama and Qwen2
models (hidden 64, 2 layers, 4 heads, 2 key/value heads) at ZeRO 0, 1 and 2, against the same
model trained unsplit in a plain torch loop in this process (AdamW, clipping, the whole batch of
8 in one forward). The world is TP x DP (--tp); each data rank takes its rows of every batch.

Per run it records the step losses (averaged over the ranks), the reference's, and for every
split weight whether this rank holds exactly 1/tp of it (elements and bytes), the names left
whole; the first run also writes ``save_16bit_model`` and ``_consolidated_16bit_state_dict``
and compares them with the reference's trained weights. ``--families``: the other families'
tiny models (Mistral, Qwen3, Gemma, Phi, GPT-2, GPT-NeoX) split by ``apply_autotp``, forward
logits and the embedding's gradient against the whole model. ``--extras``: the Llama in bf16
(ZeRO 1) and with Hugging Face's activation checkpointing (ZeRO 0). ``--configurable``: the
Llama with a vocabulary-parallel LM head, with partition_config specs, with preset_model and a
tp_grain_size that keeps the split even, Phi-3's fused gate_up_proj split by a spec's shape,
tp_grain_size 48 under the built-in rules and under the preset (48 + 80); the keys refused; the
all-reduces of one forward and backward. ``--uneven-specs``: heads and widths the size does not
divide, under layer specs. ``--float64-steps N``: the models in float64, N steps at ZeRO 0-2
against the unsplit float64 loop, and the unsplit float32 loop's distance from it
(``float64_runs``). Writes --out/rank_{r}.json."""

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import transformers

import dslaunch
from dslaunch.engine.parallel.autotp import apply_autotp, slice_tp_state

BATCH, SEQ, VOCAB, MICRO_STEPS = 8, 12, 96, 2
LR, CLIP = 1e-2, 0.5


def build(kind):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  attention_dropout=0.0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).float()
    if kind == "qwen2":  # q/k/v with biases, tied embeddings
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **common, tie_word_embeddings=True)).float()
    # heads and MLP widths that 2 does not divide: cut unevenly, as DeepSpeed cuts them
    if kind == "llama_uneven":  # 6 query heads on 3 key/value heads: 4+2 and 2+1; MLP 50+49
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(
            common, hidden_size=48, intermediate_size=99, num_attention_heads=6,
            num_key_value_heads=3))).float()
    if kind == "gpt2_uneven":  # fused c_attn of 3 heads (2+1 per part), MLP 50+49, tied head
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=3, n_inner=99, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).float()
    if kind == "phi3_uneven":  # the fused gate_up_proj of two 99-feature parts: 50+49 each
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(**dict(
            common, hidden_size=48, intermediate_size=99, num_attention_heads=6,
            num_key_value_heads=3), pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0)).float()
    if kind == "phi3":  # fused qkv_proj and gate_up_proj: layers the built-in rules miss
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(
            **common, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0)).float()
    raise ValueError(kind)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def reference(kind, steps):
    model = build(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    losses = []
    for step in range(steps):
        ids = batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def split_report(model, full):
    """Every split weight holds exactly 1/tp of the whole one (elements and bytes)."""
    whole = dict(full.named_parameters())
    split, kept, wrong, sizes = 0, [], [], {}
    for n, prm in model.named_parameters():
        f = whole[n]
        if getattr(prm, "tensor_model_parallel", False):
            split += 1
            sizes[n] = [prm.numel(), f.numel(), prm.element_size()]
            if prm.numel() * tp != f.numel() or \
                    prm.numel() * prm.element_size() * tp != f.numel() * f.element_size():
                wrong.append(n)
        else:
            kept.append(n)
            if prm.shape != f.shape:
                wrong.append(n)
    return {"split": split, "kept": kept, "wrong": wrong, "sizes": sizes,
            "param_bytes": sum(q.numel() * q.element_size() for q in model.parameters()),
            "full_bytes": sum(q.numel() * q.element_size() for q in full.parameters())}


def train(kind, stage, ref, first, bf16=False, act_ckpt=False, tp_keys=None):
    model = build(kind)
    if act_ckpt:  # Hugging Face's activation checkpointing around each decoder layer
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    micro = BATCH // (dp * MICRO_STEPS)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": MICRO_STEPS,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
              "gradient_clipping": CLIP,
              # (stage 3: save_16bit_model gathers only with the flag, as in DeepSpeed)
              "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save":
                                    stage == 3},
              "tensor_parallel": {"autotp_size": tp, **(tp_keys or {})}, "steps_per_print": 1000,
              "bf16": {"enabled": bf16}}
    before = {id(q) for q in model.parameters()}
    engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
    losses = []
    for step in range(args.steps):
        ids = batch(step)
        total = 0.0
        for m in range(MICRO_STEPS):
            rows = ids[(dp_rank * MICRO_STEPS + m) * micro:(dp_rank * MICRO_STEPS + m + 1) * micro]
            loss = engine(input_ids=rows, labels=rows).loss
            engine.backward(loss)
            engine.step()
            total += loss.item() / MICRO_STEPS
        t = torch.tensor([total], dtype=torch.float64)
        dist.all_reduce(t)
        losses.append(t.item() / world)
    out = {"losses": losses, "ref": ref[0], "dp": engine.dp_world_size,
           # the split layers keep the model's Parameter objects (optimizers built before)
           "params_kept": {id(q) for q in engine.module.parameters()} == before,
           "split": split_report(engine.module, build(kind))}
    if first:
        d = Path(args.out) / f"{kind}_16bit"
        engine.save_16bit_model(str(d))
        # (DeepSpeed's, too, refuses a model that nothing partitions or splits)
        cons = engine._consolidated_16bit_state_dict() if tp > 1 else None
        if rank == 0:
            saved = torch.load(d / "pytorch_model.bin", weights_only=True)
            want = ref[1]
            out["saved_keys_equal"] = sorted(saved) == sorted(want)
            out["saved_shapes_equal"] = all(saved[k].shape == want[k].shape for k in want)
            out["saved_max_diff"] = max((saved[k] - want[k]).abs().max().item() for k in want)
            local = slice_tp_state(saved, engine.module)  # this rank's slices of the file
            out["saved_slices_equal_live"] = all(
                torch.equal(local[n].float(), prm.detach().float())
                for n, prm in engine.module.named_parameters())
            out["consolidated_equal_saved"] = cons is None or sorted(cons) == sorted(saved) and all(
                torch.equal(cons[k], saved[k]) for k in saved)
        if args.save:
            engine.save_checkpoint(args.save, tag="tp")
            out["saved_checkpoint"] = True
    if args.save_each and kind.startswith("llama") and not (bf16 or act_ckpt or tp_keys):
        # the ZeRO 1-2 resumes' source
        engine.save_checkpoint(args.save_each, tag=f"z{stage}" + kind[len("llama"):])
    return out


LLAMA_SPECS = [{"patterns": [r".*\.(o|down)_proj\.weight$"], "partition_type": "row"},
               {"patterns": [r".*\.[qkv]_proj\.weight$", r".*\.(gate|up)_proj\.weight$"],
                "partition_type": "column"}]
# Phi-3: the MLP's fused [gate; up] split part by part, down row-parallel; the attention (whose
# fused qkv Phi-3 slices by the model's whole sizes) left whole
PHI3_SPECS = [{"patterns": [r".*\.gate_up_proj\.weight$"], "partition_type": "column",
               "shape": [2, -1], "partition_dim": 0},
              {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "row"},
              {"patterns": [r".*\.self_attn\..*"], "partition_type": "skip"}]


def all_reduces(model):
    """gloo all-reduces in one forward and backward of ``model`` (the profiler's count)."""
    from torch.profiler import ProfilerActivity, profile

    ids = batch(0)[:2]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    return sum(1 for e in prof.events() if e.name == "gloo:all_reduce")


def configurable():
    """DeepSpeed's other tensor_parallel keys: vocab_parallel_lm_head, partition_config,
    preset_model, tp_grain_size; and the all-reduces one Llama forward and backward costs."""
    from dslaunch.engine.parallel.topology import build_grid

    out = {}
    ref = reference("llama", args.steps)
    out["llama_vocab_z1"] = train("llama", 1, ref, False, tp_keys={"vocab_parallel_lm_head": True})
    out["llama_specs_z0"] = train("llama", 0, ref, False, tp_keys={"partition_config": {
        "use_default_specs": False, "layer_specs": LLAMA_SPECS}})
    out["llama_preset_z2"] = train("llama", 2, ref, False, tp_keys={"preset_model": "llama",
                                                                     "tp_grain_size": 64})
    out["phi3_specs_z1"] = train("phi3", 1, reference("phi3", args.steps), False,
                                 tp_keys={"partition_config": {"layer_specs": PHI3_SPECS}})
    # the built-in rules cut the MLP's 128 features in grains of 48 as DeepSpeed does: 48 + 80,
    # and so do the preset's specs (the grain given as DeepSpeed's nested tp.tp_grain_size)
    out["llama_grain48_z1"] = train("llama", 1, ref, False, tp_keys={"tp_grain_size": 48})
    out["llama_preset_grain48_z1"] = train("llama", 1, ref, False, tp_keys={
        "preset_model": "llama", "tp": {"tp_grain_size": 48}})
    refusals = {"preset": {"preset_model": "bloom"},
                "shape": {"partition_config": {"layer_specs": [
                    {"patterns": [".*"], "shape": [4, -1, 16], "partition_dim": 1}]}},
                "type": {"partition_config": {"layer_specs": [
                    {"patterns": [".*"], "partition_type": "diagonal"}]}}}
    out["refused"] = {}
    for name, keys in refusals.items():
        try:
            train("llama", 0, ([0.0], None), False, tp_keys=keys)
            out["refused"][name] = None
        except ValueError as e:
            out["refused"][name] = str(e)
    group = build_grid(model=tp).get_model_parallel_group()
    counts = {}
    for label, section in (("plain", None), ("vocab_head", SimpleNamespace(
            vocab_parallel_lm_head=True, partition_config=None, preset_model=None,
            tp_grain_size=1, extra={}))):
        model = build("llama")
        apply_autotp(model, group, section)
        counts[label] = all_reduces(model)
    out["all_reduces"] = counts
    return out


def uneven_specs():
    """Layer specs cut what the size does not divide as the built-in rules do: the uneven Llama
    under preset_model "llama" (ZeRO 1), the uneven Phi-3's fused gate_up_proj under a spec's
    shape [2, -1] (ZeRO 2: each part 50 + 49)."""
    return {"llama_uneven_preset_z1": train("llama_uneven", 1, reference("llama_uneven", args.steps),
                                            False, tp_keys={"preset_model": "llama"}),
            "phi3_uneven_specs_z2": train("phi3_uneven", 2, reference("phi3_uneven", args.steps),
                                          False, tp_keys={"partition_config": {
                                              "layer_specs": PHI3_SPECS}})}


def families():
    """Forward logits and the embedding's gradient of each family's tiny model, split vs whole."""
    from dslaunch.engine.parallel.topology import build_grid

    group = build_grid(model=tp).get_model_parallel_group()
    small = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=64)
    cfgs = {
        "mistral": (transformers.MistralForCausalLM,
                    transformers.MistralConfig(**small, num_key_value_heads=2)),
        "qwen3": (transformers.Qwen3ForCausalLM,
                  transformers.Qwen3Config(**small, num_key_value_heads=2, head_dim=16)),
        "gemma": (transformers.GemmaForCausalLM,
                  transformers.GemmaConfig(**small, num_key_value_heads=2, head_dim=16)),
        "phi": (transformers.PhiForCausalLM, transformers.PhiConfig(**small)),
        "gpt2": (transformers.GPT2LMHeadModel,
                 transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                         n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)),
        "gpt_neox": (transformers.GPTNeoXForCausalLM,
                     transformers.GPTNeoXConfig(**small, hidden_dropout=0.0,
                                                attention_dropout=0.0)),
    }
    res = {}
    ids = batch(0)[:2]
    for name, (cls, cfg) in cfgs.items():
        torch.manual_seed(0)
        full = cls(cfg).float().eval()
        torch.manual_seed(0)
        part = cls(cfg).float().eval()
        apply_autotp(part, group)
        lf = full(input_ids=ids, labels=ids)
        lp = part(input_ids=ids, labels=ids)
        lf.loss.backward()
        lp.loss.backward()
        emb = [m for m in full.modules() if isinstance(m, torch.nn.Embedding)][0].weight.grad
        emb_p = [m for m in part.modules() if isinstance(m, torch.nn.Embedding)][0].weight.grad
        n_split = sum(1 for q in part.parameters() if getattr(q, "tensor_model_parallel", False))
        res[name] = {"logits": (lf.logits - lp.logits).abs().max().item(),
                     "emb_grad": (emb - emb_p).abs().max().item(), "split": n_split}
    return res


def uneven_head():
    """The uneven Llama with an untied LM head of 97 vocabulary rows (not divisible by 2), split
    (logits gathered; and vocab_parallel_lm_head, logits left split) vs whole: the loss, the
    logits and the head's and embedding's gradients, one forward and backward."""
    from dslaunch.engine.parallel.topology import build_grid

    group = build_grid(model=tp).get_model_parallel_group()
    cfg = transformers.LlamaConfig(vocab_size=VOCAB + 1, hidden_size=48, intermediate_size=99,
                                   num_hidden_layers=2, num_attention_heads=6,
                                   num_key_value_heads=3, max_position_embeddings=64)
    ids = batch(0)[:2]
    torch.manual_seed(0)
    full = transformers.LlamaForCausalLM(cfg).float()
    out_f = full(input_ids=ids, labels=ids)
    out_f.loss.backward()
    res = {}
    for label, section in (("gathered", None), ("vocab_parallel", SimpleNamespace(
            vocab_parallel_lm_head=True, partition_config=None, preset_model=None,
            tp_grain_size=1, extra={}))):
        torch.manual_seed(0)
        part = transformers.LlamaForCausalLM(cfg).float()
        apply_autotp(part, group, section)
        out_p = part(input_ids=ids, labels=ids)
        out_p.loss.backward()
        head = part.lm_head.weight
        rows = torch.cat([torch.arange(a, b) for a, b in head.tp_ranges])
        logits_f = out_f.logits if label == "gathered" else out_f.logits[..., rows]
        res[label] = {"loss": abs(out_f.loss.item() - out_p.loss.item()),
                      "logits": (logits_f - out_p.logits).abs().max().item(),
                      "head_rows": int(head.shape[0]),
                      "head_grad": (full.lm_head.weight.grad[rows] - head.grad).abs().max().item(),
                      "emb_grad": (full.model.embed_tokens.weight.grad
                                   - part.model.embed_tokens.weight.grad).abs().max().item()}
    return res


def shifted_loss(model, ids):
    """Next-token cross entropy in the logits' own dtype (Hugging Face's loss casts the logits to
    fp32 first, which would cap a float64 run at fp32's precision)."""
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))


def float64_runs(kind, steps):
    """The model in float64, trained ``steps`` steps unsplit (whole batch, plain loop) and by the
    engine under AutoTP at ZeRO 0, 1 and 2 (micro-batches, accumulation): rounding left out, the
    split must give the unsplit losses to float64 precision. The unsplit model in float32 too: how
    far fp32's own rounding carries it from the float64 losses."""
    def plain(dtype):
        model = build(kind).to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        losses = []
        for step in range(steps):
            loss = shifted_loss(model, batch(step))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    out = {"ref": plain(torch.float64), "ref_fp32": plain(torch.float32)}
    micro = BATCH // (dp * MICRO_STEPS)
    for stage in (0, 1, 2):
        model = build(kind).double()
        config = {"train_micro_batch_size_per_gpu": micro,
                  "gradient_accumulation_steps": MICRO_STEPS,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
                  "gradient_clipping": CLIP, "zero_optimization": {"stage": stage},
                  "tensor_parallel": {"autotp_size": tp}, "steps_per_print": 1000}
        engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                              config=config)
        losses = []
        for step in range(steps):
            ids = batch(step)
            total = torch.zeros(1, dtype=torch.float64)
            for m in range(MICRO_STEPS):
                lo = (dp_rank * MICRO_STEPS + m) * micro
                loss = shifted_loss(engine, ids[lo:lo + micro])
                engine.backward(loss)
                engine.step()
                total += loss.detach() / MICRO_STEPS
            dist.all_reduce(total)
            losses.append(total.item() / world)
        out[f"z{stage}"] = {"losses": losses,
                            "dtypes": sorted({str(q.dtype) for q in engine.module.parameters()})}
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--stages", default="0,1,2")
    p.add_argument("--models", default="llama,qwen2")
    p.add_argument("--families", action="store_true")
    p.add_argument("--extras", action="store_true", help="bf16 and activation checkpointing runs")
    p.add_argument("--configurable", action="store_true",
                   help="vocab_parallel_lm_head, partition_config, preset_model, tp_grain_size")
    p.add_argument("--save-each", default=None,
                   help="save a checkpoint of each plain Llama run here, tag z<stage>")
    p.add_argument("--save", default=None, help="save a checkpoint of the first run here")
    p.add_argument("--uneven-specs", action="store_true",
                   help="the uneven Llama and Phi-3 under layer specs (preset_model, shape)")
    p.add_argument("--uneven-head", action="store_true",
                   help="an LM head of 97 rows split vs whole, forward and backward")
    p.add_argument("--float64-steps", type=int, default=0,
                   help="also train the models N steps in float64 at ZeRO 0-2 (float64_runs)")
    args, _ = p.parse_known_args()
    dslaunch.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp
    dp, dp_rank = world // tp, rank // tp
    res = {"rank": rank, "tp_rank": rank % tp, "dp_rank": dp_rank}
    first = True
    for kind in args.models.split(","):
        ref = reference(kind, args.steps)
        for stage in (int(s) for s in args.stages.split(",")):
            res[f"{kind}_z{stage}"] = train(kind, stage, ref, first)
            first = False
    if args.float64_steps:
        res["float64"] = {kind: float64_runs(kind, args.float64_steps)
                          for kind in args.models.split(",")}
    if args.extras:  # bf16 (ZeRO 1) and activation checkpointing (ZeRO 0) on the Llama
        ref = reference("llama", args.steps)
        res["llama_bf16_z1"] = train("llama", 1, ref, False, bf16=True)
        res["llama_actckpt_z0"] = train("llama", 0, ref, False, act_ckpt=True)
    if args.families:
        res["families"] = families()
    if args.configurable:
        res["configurable"] = configurable()
    if args.uneven_specs:
        res["uneven_specs"] = uneven_specs()
    if args.uneven_head:
        res["uneven_head"] = uneven_head()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank_{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()
