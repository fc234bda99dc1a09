""""auto" configs (dslaunch/config/auto.py): `config validate|show` against what the Hugging Face
Trainer really writes into them (its own HfTrainerDeepSpeedConfig code), and the engine's reading
at dslaunch.initialize (hidden-size keys from a real Transformers model, the rest refused)."""

import copy
import json
from pathlib import Path

import pytest
from accelerate.utils.deepspeed import HfDeepSpeedConfig
from click.testing import CliRunner
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

import dslaunch
from dslaunch.cli import main
from dslaunch.config import ConfigError, resolve_config

ROOT = Path(__file__).resolve().parents[1]
HF_CONFIGS = ["configs/hf_trainer_zero2_auto.json", "configs/hf_trainer_zero3_auto.json"]
HIDDEN = 48


def trainer_filled(raw: dict, args: TrainingArguments, steps: int) -> dict:
    """``raw`` as the Trainer fills it: its HfTrainerDeepSpeedConfig methods over Accelerate's
    config holder. (Transformers only builds the class when `deepspeed` is installed; the methods
    that fill "auto" are taken as they are.)"""
    methods = {k: v for k, v in vars(HfTrainerDeepSpeedConfig).items() if not k.startswith("__")}
    hf = type("TrainerConfig", (HfDeepSpeedConfig,), methods)(copy.deepcopy(raw))
    hf._dtype, hf.mismatches = None, []
    hf.trainer_config_process(args)
    model = GPT2LMHeadModel(GPT2Config(n_embd=HIDDEN, n_layer=1, n_head=2, vocab_size=64, n_positions=16))
    hf.trainer_config_finalize(args, model, steps)
    return hf.config


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("path", HF_CONFIGS)
def test_validate_passes_with_one_line_per_auto(path):
    result = invoke("config", "validate", path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"{path}: OK (no --world-size given: train_batch_size=auto, micro=auto, grad_accum=auto)"
    autos = [line.removeprefix("  auto: ").split(":")[0] for line in lines[1:]]
    raw = json.loads((ROOT / path).read_text())
    written = [k for k, v in _flat(raw) if v == "auto"]
    assert sorted(autos) == sorted(written) and len(autos) == len(set(autos))
    assert "  auto: optimizer.params.lr: HF Trainer: learning_rate; Accelerate: DummyOptim(lr=...); " \
           "config show --lr" in lines


@pytest.mark.parametrize("path", HF_CONFIGS)
def test_show_with_the_trainers_arguments_writes_what_the_trainer_writes(path):
    args = _trainer_args(per_device_train_batch_size=3, gradient_accumulation_steps=2, learning_rate=2e-4,
                         adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-7, weight_decay=0.05, max_grad_norm=0.7,
                         warmup_steps=4, bf16=True)
    reference = trainer_filled(json.loads((ROOT / path).read_text()), args, steps=50)
    result = invoke("config", "show", path, "--json", "--world-size", "1", "--hidden-size", str(HIDDEN),
                    "--lr", "2e-4", "--micro-batch-size", "3", "--grad-accum", "2", "--adam-betas", "0.8,0.99",
                    "--adam-eps", "1e-7", "--weight-decay", "0.05", "--max-grad-norm", "0.7",
                    "--precision", "bf16", "--warmup-min-lr", "0", "--warmup-steps", "4", "--total-steps", "50")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert '"auto"' not in json.dumps(shown["values"])
    assert shown["values"] == resolve_config(reference, world_size=1).values
    assert len(shown["autos"]) == sum(v == "auto" for _, v in _flat(json.loads((ROOT / path).read_text())))


def test_show_keeps_auto_where_no_option_gives_it_and_bad_betas_are_refused():
    result = invoke("config", "show", HF_CONFIGS[1], "--json", "--lr", "1e-3")
    shown = json.loads(result.output)
    assert shown["values"]["optimizer"]["params"] == {"lr": 1e-3, "betas": "auto", "eps": "auto",
                                                      "weight_decay": "auto"}
    assert shown["sources"]["optimizer.params.lr"] == "auto"
    bad = invoke("config", "show", HF_CONFIGS[1], "--adam-betas", "0.9")
    assert bad.exit_code == 2 and "'0.9': expected two numbers, e.g. 0.9,0.999" in bad.output


def _tiny_gpt2():
    import torch

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=HIDDEN, n_layer=1, n_head=2, vocab_size=64, n_positions=16))


def _trainer_args(**kw):
    kw.setdefault("per_device_train_batch_size", 2)
    return TrainingArguments(output_dir="unused", use_cpu=True, report_to=[], **kw)


def test_engine_fills_the_hidden_size_keys_from_the_model():
    filled = trainer_filled(json.loads((ROOT / HF_CONFIGS[1]).read_text()), _trainer_args(), steps=10)
    for key in HIDDEN_KEYS:  # left for the engine: Accelerate's path would have filled them too
        filled["zero_optimization"][key] = "auto"
    engine, *_ = dslaunch.initialize(model=_tiny_gpt2(), config=filled)
    zero = engine._config.zero_optimization
    # what Transformers' trainer_config_finalize writes for a hidden size of 48
    assert [getattr(zero, key) for key in HIDDEN_KEYS] == [48 * 48, int(0.9 * 48 * 48), 10 * 48]
    engine.destroy()


HIDDEN_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def test_engine_refuses_what_the_trainer_should_have_filled_naming_each_key():
    raw = json.loads((ROOT / HF_CONFIGS[0]).read_text())
    raw["train_micro_batch_size_per_gpu"] = 2
    with pytest.raises(ConfigError) as info:
        dslaunch.initialize(model=_tiny_gpt2(), config=raw)
    refused = sorted(p.split(":")[0] for p in info.value.problems)
    assert refused == ["bf16.enabled", "fp16.enabled", "gradient_clipping", "optimizer.params.betas",
                       "optimizer.params.eps", "optimizer.params.lr", "optimizer.params.weight_decay",
                       "scheduler.params.total_num_steps", "scheduler.params.warmup_max_lr",
                       "scheduler.params.warmup_min_lr", "scheduler.params.warmup_num_steps"]
    assert any(p.startswith('bf16.enabled: "auto" cannot be resolved here; put true or false (nothing '
                            "filled it before dslaunch.initialize: HF Trainer: bf16 or bf16_full_eval")
               for p in info.value.problems)


def _flat(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, prefix + key + ".")
        else:
            yield prefix + key, value
