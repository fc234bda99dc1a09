"""Config subsystem: loading, validation messages, batch triad, "auto" values, feature gating."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dslaunch.config import ConfigError, ResolvedConfig, load_config, resolve_config
from dslaunch.config.features import NOT_SUPPORTED_YET

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").iterdir() if p.suffix in (".json", ".yaml", ".yml"))

BASE = {"train_micro_batch_size_per_gpu": 4}


def problems(raw, **kw):
    """The problem lines resolve_config raises for ``raw`` (fails the test when it raises none)."""
    kw.setdefault("world_size", 2)
    with pytest.raises(ConfigError) as info:
        resolve_config(raw, **kw)
    return info.value.problems


# --- unknown keys, types, ranges -------------------------------------------------------------

def test_top_level_typo_suggests_nearest_key():
    assert problems({**BASE, "zero_optimisation": {"stage": 0}}) == [
        "zero_optimisation: unknown key; did you mean zero_optimization?"]


def test_nested_typo_suggests_nearest_key():
    assert problems({**BASE, "zero_optimization": {"stag": 0}}) == [
        "zero_optimization.stag: unknown key; did you mean stage?"]


def test_key_in_wrong_section_names_where_it_belongs():
    assert problems({**BASE, "initial_scale_power": 12}) == [
        "initial_scale_power: unknown key here; it belongs in fp16.initial_scale_power"]


def test_scheduler_param_typo_suggests_nearest():
    raw = {**BASE, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 5}}}
    assert problems(raw) == ["scheduler.params.warmup_num_step: unknown key; did you mean warmup_num_steps?"]


def test_unknown_scheduler_type_suggests_nearest():
    (line,) = problems({**BASE, "scheduler": {"type": "WarmupCosine", "params": {}}})
    assert line.startswith('scheduler.type: "WarmupCosine" is not allowed; expected one of')
    assert line.endswith('(did you mean "WarmupCosineLR"?)')


def test_wrong_type_and_range_name_path_value_and_what_is_allowed():
    raw = {**BASE, "steps_per_print": "often", "gradient_clipping": -1,
           "fp16": {"enabled": "yes", "initial_scale_power": 70},
           "zero_optimization": {"offload_optimizer": {"device": "CPU"}}}
    assert sorted(problems(raw)) == sorted([
        'steps_per_print: "often" is not allowed; expected an integer >= 1',
        "gradient_clipping: -1 is not allowed; expected a number >= 0",
        'fp16.enabled: "yes" is not allowed; expected true or false',
        "fp16.initial_scale_power: 70 is not allowed; expected an integer in [0, 64]",
        'zero_optimization.offload_optimizer.device: "CPU" is not allowed; expected one of '
        "'none', 'cpu', 'nvme' (did you mean \"cpu\"?)",
    ])


def test_all_problems_reported_at_once_with_file_name(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimisation": {}, "fp16": {"enabled": True, "hysteresis": 0},
                                "bf16": {"enabled": True}, "optimizer": {"type": "AdamX"},
                                "train_batch_size": 3, "train_micro_batch_size_per_gpu": 2}))
    with pytest.raises(ConfigError) as info:
        resolve_config(str(path), world_size=2)
    err = info.value
    assert len(err.problems) == 5, err.problems
    lines = str(err).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert f"{path}: optimizer.type: \"AdamX\" is not a known optimizer; did you mean Adam?" in lines
    assert f"{path}: fp16.enabled: fp16 and bf16 are both enabled; enable one of them" in lines


def test_lenient_numbers_and_bools_are_converted():
    cfg = resolve_config({**BASE, "zero_optimization": {"reduce_bucket_size": 5e8, "stage": 0.0},
                          "optimizer": {"type": "adamw", "params": {"lr": "1e-3", "betas": ["0.9", 0.95]}},
                          "fp16": {"enabled": 0}, "wall_clock_breakdown": 1}, world_size=1)
    assert cfg.get("zero_optimization.reduce_bucket_size") == 500_000_000
    assert type(cfg.get("zero_optimization.reduce_bucket_size")) is int
    assert cfg.get("optimizer.params.lr") == 0.001 and cfg.get("optimizer.params.betas") == [0.9, 0.95]
    assert cfg.get("optimizer.type") == "AdamW"  # DeepSpeed compares names case-insensitively
    assert cfg.get("fp16.enabled") is False and cfg.get("wall_clock_breakdown") is True


def test_strictness_where_leniency_would_hide_mistakes():
    out = problems({**BASE, "steps_per_print": True, "gradient_accumulation_steps": 2.5,
                    "fp16": {"enabled": 2}})
    assert sorted(out) == sorted([
        "steps_per_print: true is not allowed; expected an integer >= 1",
        "gradient_accumulation_steps: 2.5 is not allowed; expected an integer >= 1",
        "fp16.enabled: 2 is not allowed; expected true or false",
    ])


def test_section_that_is_not_a_mapping():
    assert problems({**BASE, "fp16": True}) == ["fp16: expected a section (a mapping of keys), got true"]


def test_required_scheduler_param_missing():
    out = problems({**BASE, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}})
    assert out == ["scheduler.params.total_num_steps: missing; put an integer >= 1 here"]


def test_optimizer_type_is_loose_for_torch_optim_names():
    for name in ("RMSprop", "NAdam", "Adagrad", "Lion", "SomeCustomOptimizer"):
        cfg = resolve_config({**BASE, "optimizer": {"type": name, "params": {"lr": 0.1, "foo": 1}}},
                             world_size=1)
        assert cfg.get("optimizer.params.foo") == 1  # free params pass through
    assert problems({**BASE, "optimizer": {"type": "adam w"}})[0].startswith("optimizer.type:")


# --- aliases and deprecated spellings ----------------------------------------------------------

def test_aliases_map_to_canonical_keys():
    cfg = resolve_config({**BASE, "bfloat16": {"enabled": True}, "aio": {"thread_count": 4},
                          "zero_optimization": {"stage3_gather_fp16_weights_on_model_save": True},
                          "tensor_parallel": {"tp_size": 1}}, world_size=1)
    assert cfg.get("bf16.enabled") is True and "bfloat16" not in cfg.values
    assert cfg.get("aio.intra_op_parallelism") == 4
    assert cfg.get("zero_optimization.stage3_gather_16bit_weights_on_model_save") is True
    assert problems({**BASE, "aio": {"thread_count": 4, "intra_op_parallelism": 2}}) == [
        "aio.thread_count: 4 conflicts with aio.intra_op_parallelism=2 (thread_count is another name "
        "for intra_op_parallelism); keep one"]


def test_deprecated_zero_spellings():
    cfg = resolve_config({**BASE, "zero_optimization": True}, world_size=1, check_supported=False)
    assert cfg.get("zero_optimization.stage") == 1
    cfg = resolve_config({**BASE, "zero_optimization": {"stage": 2, "cpu_offload": True}}, world_size=1,
                         check_supported=False)
    assert cfg.get("zero_optimization.offload_optimizer.device") == "cpu"


# --- batch triad -------------------------------------------------------------------------------

@pytest.mark.parametrize("given, world, expected, inferred", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (32, 4, 4), {"gradient_accumulation_steps"}),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2, (32, 8, 2), {"train_micro_batch_size_per_gpu"}),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2, (16, 4, 2), {"train_batch_size"}),
    ({"train_batch_size": 12}, 3, (12, 4, 1), {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}),
    ({"train_micro_batch_size_per_gpu": 4}, 3, (12, 4, 1), {"train_batch_size", "gradient_accumulation_steps"}),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
     2, (16, 4, 2), set()),
])
def test_triad_infers_the_missing_value(given, world, expected, inferred):
    cfg = resolve_config(given, world_size=world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == expected
    triad = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert {k for k in triad if cfg.sources[k] == "inferred"} == inferred
    assert {k for k in triad if cfg.sources[k] == "file"} == set(triad) - inferred


def test_triad_inconsistency_prints_the_three_numbers_and_world_size():
    out = problems({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                    "gradient_accumulation_steps": 2}, world_size=2)
    assert out == ["train_batch_size: inconsistent batch sizes: train_batch_size=32 but "
                   "train_micro_batch_size_per_gpu=4 * gradient_accumulation_steps=2 * world size 2 = 16; "
                   "change one of the three"]


def test_triad_uses_dp_size_and_names_both_sizes():
    cfg = resolve_config({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}, world_size=4,
                         dp_world_size=2)
    assert cfg.gradient_accumulation_steps == 2
    (line,) = problems({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 1}, world_size=4, dp_world_size=2)
    assert "data-parallel size 2 (world size 4)" in line


def test_triad_not_divisible_and_missing():
    (line,) = problems({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, world_size=2)
    assert line.startswith("train_batch_size: 30 is not divisible by train_micro_batch_size_per_gpu=4 * "
                           "world size 2 = 8")
    for raw in ({}, {"gradient_accumulation_steps": 4}):
        (line,) = problems(raw)
        assert line.startswith("train_batch_size: missing; give train_batch_size or train_micro_batch_size_per_gpu")


def test_triad_without_world_size_says_what_depends_on_it():
    cfg = resolve_config({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})
    assert cfg.train_batch_size is None and cfg.gradient_accumulation_steps == 2
    assert cfg.notes == ["train_batch_size depends on the world size: 4 * 2 * data-parallel size"]
    cfg = resolve_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                          "gradient_accumulation_steps": 2})
    assert cfg.notes == ["train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2 "
                         "are consistent only for a data-parallel size of 4"]
    assert problems({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, world_size=None) == [
        "train_batch_size: 30 is not divisible by train_micro_batch_size_per_gpu=4; no world size makes "
        "them consistent"]


def test_bad_world_size_argument():
    assert problems(BASE, world_size=0) == ["world_size: 0 is not a valid size; expected an integer >= 1"]


# --- "auto" ------------------------------------------------------------------------------------

HF_STYLE = {
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": 100}},
    "zero_optimization": {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
    "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto",
}


def test_engine_fills_only_the_hidden_size_autos_and_refuses_the_rest_naming_them():
    # dslaunch.initialize's reading: what a framework should have filled is refused, key by key
    out = problems(HF_STYLE, world_size=4)
    refused = sorted(p.split(":", 1)[0] for p in out)
    assert refused == ["bf16.enabled", "fp16.enabled", "gradient_clipping", "optimizer.params.betas",
                       "optimizer.params.eps", "optimizer.params.weight_decay",
                       "scheduler.params.warmup_max_lr", "scheduler.params.warmup_min_lr",
                       "scheduler.params.warmup_num_steps"], out
    assert ('gradient_clipping: "auto" cannot be resolved here; put a number >= 0 (nothing filled '
            "it before dslaunch.initialize: HF Trainer: max_grad_norm;") in out[[p.split(":")[0] for p in out]
                                                                                 .index("gradient_clipping")]
    engine_ok = {k: v for k, v in HF_STYLE.items() if k not in ("fp16", "bf16", "gradient_clipping")}
    engine_ok["optimizer"] = {"type": "AdamW", "params": {"lr": 3e-4}}
    engine_ok["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}
    cfg = resolve_config(engine_ok, world_size=4, model_num_params=1_000_000)
    assert cfg.get("zero_optimization.reduce_bucket_size") == 1_000_000  # DeepSpeed's 5e8, capped
    assert cfg.get("zero_optimization.stage3_param_persistence_threshold") == 100_000  # DeepSpeed's
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps) == (8, 1)  # the triad infers them
    autos = {k for k, v in cfg.sources.items() if v == "auto"}
    assert {"train_batch_size", "gradient_accumulation_steps", "zero_optimization.reduce_bucket_size",
            "zero_optimization.stage3_prefetch_bucket_size"} <= autos
    assert cfg.sources["train_micro_batch_size_per_gpu"] == "file"
    assert resolve_config(engine_ok, world_size=4).get("zero_optimization.reduce_bucket_size") == 500_000_000
    # the model's hidden size, as Transformers and Accelerate compute them
    sized = resolve_config(engine_ok, world_size=4, fills={"hidden_size": 64})
    assert [sized.get("zero_optimization." + k) for k in (
        "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")] == [
        4096, 3686, 640]


def test_describe_reading_passes_with_one_line_per_auto_and_fills_resolve_them():
    cfg = resolve_config(HF_STYLE, world_size=4, autos="describe")
    autos = sorted(k for k, v in cfg.sources.items() if v == "auto")
    assert sorted(line.split(":")[0] for line in cfg.auto_lines) == autos and len(autos) == 14
    assert cfg.get("optimizer.params.betas") == "auto" and cfg.get("fp16.enabled") == "auto"
    line = next(x for x in cfg.auto_lines if x.startswith("fp16.enabled"))
    assert line == ('fp16.enabled: HF Trainer: fp16 or fp16_full_eval; Accelerate: '
                    'Accelerator(mixed_precision="fp16"); config show --precision')
    fills = {"precision": "bf16", "adam_betas": [0.9, 0.95], "adam_eps": 1e-6, "weight_decay": 0.1,
             "warmup_min_lr": 0.0, "warmup_steps": 5, "max_grad_norm": 0.5, "hidden_size": 8,
             "lr": 1e-3}
    full = resolve_config(HF_STYLE, world_size=4, autos="describe", fills=fills)
    assert (full.get("bf16.enabled"), full.get("fp16.enabled")) == (True, False)
    assert full.get("optimizer.params.betas") == [0.9, 0.95] and full.get("gradient_clipping") == 0.5
    # --lr fills what is "auto" (the scheduler's peak), not the lr the file writes
    assert (full.get("scheduler.params.warmup_max_lr"), full.get("optimizer.params.lr")) == (1e-3, 3e-4)
    assert full.get("zero_optimization.stage3_prefetch_bucket_size") == 57
    assert "optimizer.params.betas = [0.9, 0.95] (from --adam-betas); in a run: HF Trainer: " \
           "adam_beta1 and adam_beta2" in full.auto_lines
    # what `config show` resolved is a config the engine takes as it is
    assert resolve_config(full.values, world_size=4).get("optimizer.params.eps") == 1e-6


def test_both_batch_sizes_auto_wait_for_a_framework_in_the_describe_reading():
    raw = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": "auto"}
    cfg = resolve_config(raw, world_size=2, autos="describe")
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu) == ("auto", "auto")
    filled = resolve_config(raw, world_size=2, autos="describe",
                            fills={"micro_batch_size": 3, "grad_accum": 2})
    assert (filled.train_batch_size, filled.train_micro_batch_size_per_gpu,
            filled.gradient_accumulation_steps) == (12, 3, 2)
    assert problems(raw) == ['train_micro_batch_size_per_gpu: "auto" cannot be resolved here (the Hugging '
                             "Face Trainer fills it from per_device_train_batch_size); put the micro-batch "
                             "size per GPU, a number, and train_batch_size follows from it"]


def test_an_auto_no_framework_fills_is_refused_in_both_readings():
    raw = {**BASE, "steps_per_print": "auto", "optimizer": {"type": "SGD", "params": {"lr": 0.1,
                                                                                     "momentum": "auto"}}}
    for autos in ("engine", "describe"):
        assert sorted(problems(raw, autos=autos)) == [
            'optimizer.params.momentum: "auto" cannot be resolved: nobody (neither the Hugging Face '
            "Trainer nor Accelerate fills this key); put a number >= 0",
            'steps_per_print: "auto" cannot be resolved: nobody (neither the Hugging Face Trainer nor '
            "Accelerate fills this key); put an integer >= 1"]


def test_steps_per_print_infinity_as_accelerate_writes_it():
    # Accelerate sets steps_per_print = float("inf") in every DeepSpeed config it prepares
    cfg = resolve_config({**BASE, "steps_per_print": float("inf")}, world_size=1)
    assert cfg.get("steps_per_print") == float("inf") and cfg.sources["steps_per_print"] == "file"
    assert resolve_config(cfg.to_json(), world_size=1).get("steps_per_print") == float("inf")
    assert problems({**BASE, "steps_per_print": float("-inf")}) == [
        "steps_per_print: -Infinity is not allowed; expected an integer >= 1"]


def test_auto_that_cannot_be_resolved_is_rejected_with_what_to_put():
    raw = json.loads(json.dumps(HF_STYLE))
    raw["optimizer"]["params"]["lr"] = "auto"
    raw["scheduler"]["params"]["total_num_steps"] = "auto"
    raw["train_micro_batch_size_per_gpu"] = "auto"
    out = problems(raw)
    assert any(p.startswith('optimizer.params.lr: "auto" cannot be resolved here; put the learning rate') for p in out)
    assert any(p.startswith('scheduler.params.total_num_steps: "auto" cannot be resolved here; put') for p in out)
    assert any(p.startswith('scheduler.params.warmup_max_lr: "auto" cannot be resolved here') for p in out)
    assert any(p.startswith('train_micro_batch_size_per_gpu: "auto" cannot be resolved here') for p in out)


# --- loading -----------------------------------------------------------------------------------

def test_yaml_and_json_give_the_same_config(tmp_path):
    json_cfg = resolve_config(str(ROOT / "configs/gpt_small.json"), world_size=2)
    yaml_path = tmp_path / "same.yaml"
    yaml_path.write_text(yaml.safe_dump(load_config(ROOT / "configs/gpt_small.json")))
    assert resolve_config(str(yaml_path), world_size=2).values == json_cfg.values
    bf16 = resolve_config(str(ROOT / "configs/gpt_small_bf16.yaml"), world_size=2)
    assert bf16.get("bf16.enabled") is True
    assert {**bf16.values, "bf16": json_cfg.values["bf16"]} == json_cfg.values


def test_yaml_exponent_without_dot_is_accepted(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("train_micro_batch_size_per_gpu: 2\noptimizer:\n  type: Adam\n  params:\n    lr: 1e-3\n")
    assert load_config(str(path))["optimizer"]["params"]["lr"] == "1e-3"  # PyYAML's reading
    assert resolve_config(str(path), world_size=1).get("optimizer.params.lr") == 0.001


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train_batch_size: 8\nfp16:\n  enabled: true\n   loss_scale: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    (line,) = info.value.problems
    assert line.startswith(f"{path}:4:") and "invalid YAML" in line


def test_json_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,}\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.problems[0].startswith(f"{path}:3:") and "invalid JSON" in info.value.problems[0]


def test_duplicate_keys_are_errors(tmp_path):
    (tmp_path / "d.json").write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    (tmp_path / "d.yaml").write_text("train_batch_size: 8\nfp16: {}\ntrain_batch_size: 16\n")
    with pytest.raises(ConfigError, match="train_batch_size: key given twice"):
        load_config(str(tmp_path / "d.json"))
    with pytest.raises(ConfigError, match=r"d.yaml:3:1: invalid YAML: key 'train_batch_size' given twice"):
        load_config(str(tmp_path / "d.yaml"))


def test_missing_empty_and_non_mapping_files(tmp_path):
    for name, text, expected in [("missing.json", None, "no such config file"),
                                 ("empty.json", "  \n", "config file is empty"),
                                 ("list.yaml", "- 1\n- 2\n", "the config must be a mapping of keys at the top level")]:
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(str(path))
        assert info.value.problems == [f"{path}: {expected}"] or \
            info.value.problems[0].startswith(f"{path}: {expected}")


def test_dict_and_json_string_sources():
    raw = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}
    cfg = resolve_config(raw, world_size=2)
    assert raw == {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}  # not mutated
    assert resolve_config(json.dumps(raw), world_size=2).values == cfg.values


@pytest.mark.parametrize("raw", [HF_STYLE, BASE], ids=["hf", "minimal"])
def test_to_json_round_trips_through_resolve(raw):
    cfg = resolve_config(raw, world_size=4, autos="describe")
    again = resolve_config(cfg.to_json(), world_size=4, autos="describe")
    assert isinstance(again, ResolvedConfig) and again.values == cfg.values
    assert cfg.get("no.such.key", "x") == "x" and cfg["steps_per_print"] is None


def test_null_sections_mean_absent():
    cfg = resolve_config({**BASE, "optimizer": None, "zero_optimization": {"offload_param": None}}, world_size=1)
    assert cfg.get("optimizer") is None and cfg.get("zero_optimization.offload_param.device") == "none"


def test_defaults_are_deepspeeds_and_marked_default():
    cfg = resolve_config(BASE, world_size=1)
    assert cfg.get("zero_optimization.stage") == 0 and cfg.get("zero_optimization.overlap_comm") is False
    assert cfg.get("fp16.initial_scale_power") == 16 and cfg.get("fp16.loss_scale_window") == 1000
    assert cfg.get("steps_per_print") is None and cfg.get("gradient_clipping") == 1.0  # as DeepSpeed 0.19.8
    assert cfg.get("optimizer") is None and cfg.get("scheduler") is None
    assert cfg.sources["fp16.hysteresis"] == "default" and cfg.sources["train_micro_batch_size_per_gpu"] == "file"


# --- features not supported yet ----------------------------------------------------------------

@pytest.mark.parametrize("section, line", [
    ({"hybrid_engine": {"enabled": True}},
     "hybrid_engine.enabled: not supported yet (the hybrid (RLHF) engine: generate with the "
     "model itself or an inference server; see docs/porting.md, 'Config sections dslaunch "
     "refuses'; not planned yet)"),
    ({"compression_training": {"sparse_pruning": {
        "shared_parameters": {"enabled": True, "method": "snip_momentum"},
        "different_groups": {"g": {"params": {"dense_ratio": 0.5}, "modules": ["fc"]}}}}},
     "compression_training.sparse_pruning.shared_parameters.method: snip_momentum is not "
     "supported (it needs Intel neural_compressor); use l1 or topk"),
])
def test_features_not_supported_yet(section, line):
    assert problems({**BASE, **section}) == [line]
    resolve_config({**BASE, **section}, world_size=2, check_supported=False)  # valid otherwise


def test_disabled_sections_are_fine():
    cfg = resolve_config({**BASE, "wandb": {"enabled": False, "project": "p"}, "amp": {"enabled": False},
                          "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none"}},
                          "csv_monitor": {"enabled": True, "output_path": "logs/"},
                          "tensorboard": {"enabled": True}, "pipeline": {"stages": 1}}, world_size=2)
    assert cfg.get("csv_monitor.output_path") == "logs/"


def test_feature_table_rows_name_an_issue_or_say_unplanned():
    assert all(f.issue == "" or f.issue.startswith("issue ") for f in NOT_SUPPORTED_YET)


# --- shipped configs and import cost -----------------------------------------------------------

def test_there_are_example_configs():
    names = {p.name for p in CONFIGS}
    assert {"gpt_small.json", "gpt_small_bf16.yaml", "gpt_fp16.json", "gpt_grad_accum.json"} <= names


# TrainingArguments' defaults (per_device_train_batch_size 8, learning_rate 5e-5, ...), a model
# with hidden_size 64 and a 100-step run: what the Trainer writes into an "auto" config
TRAINER_FILLS = {"micro_batch_size": 8, "grad_accum": 1, "lr": 5e-5, "adam_betas": [0.9, 0.999],
                 "adam_eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0, "precision": "fp32",
                 "warmup_min_lr": 0, "warmup_steps": 1, "total_steps": 100, "hidden_size": 64}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_every_shipped_config_validates(path, world_size):
    if path.name.startswith("hf_trainer_"):  # "auto" configs: validated as the Trainer fills them
        cfg = resolve_config(str(path), world_size=world_size, autos="describe", fills=TRAINER_FILLS)
        assert '"auto"' not in json.dumps(cfg.values)
        resolve_config(cfg.values, world_size=world_size)  # and the engine takes the filled config
    else:
        cfg = resolve_config(str(path), world_size=world_size)
    sp = cfg.get("sequence_parallel_size") or 1  # sequence-parallel ranks share a sample
    dp = world_size // sp if world_size % sp == 0 else world_size  # (AutoTP's ranks count)
    assert cfg.train_batch_size == (cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps
                                    * dp)


def test_gpt_small_is_what_the_readme_promises():
    cfg = resolve_config(str(ROOT / "configs/gpt_small.json"), world_size=2)
    assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps, cfg.train_batch_size) == (4, 1, 8)
    assert cfg.get("optimizer.type") == "AdamW" and cfg.get("optimizer.params") == {
        "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    assert cfg.get("scheduler.params.warmup_num_steps") == 20 and cfg.get("scheduler.params.total_num_steps") == 200
    assert cfg.get("gradient_clipping") == 1.0 and cfg.get("steps_per_print") == 10
    assert cfg.get("fp16.enabled") is False and cfg.get("bf16.enabled") is False
    assert resolve_config(str(ROOT / "configs/gpt_fp16.json"), world_size=2).get("fp16.loss_scale") == 0.0
    assert resolve_config(str(ROOT / "configs/gpt_grad_accum.json"), world_size=2).gradient_accumulation_steps == 4


def test_config_package_does_not_import_torch():
    code = ("import sys, dslaunch.config, dslaunch.cli.config; "
            "from dslaunch.config import resolve_config; resolve_config({'train_batch_size': 2}, world_size=2); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize("raw, expected", [
    ("[1, 2]", "<config JSON string>: the config must be a mapping of keys at the top level, got list"),
    ({**BASE, "scheduler": "WarmupLR"}, 'scheduler: expected a section (a mapping of keys), got "WarmupLR"'),
    ({**BASE, "optimizer": {"params": {"lr": 1}}}, "optimizer.type: missing; put a string here"),
    ({**BASE, "optimizer": {"type": "auto"}},
     'optimizer.type: "auto" cannot be resolved: nobody (neither the Hugging Face Trainer nor Accelerate fills '
     'this key); put an optimizer name'),
    ({**BASE, "fp16": {3: 1}}, "fp16.3: keys must be strings"),
    ({"train_batch_size": [8]}, "train_batch_size: [8] is not allowed; expected an integer >= 1"),
    ({**BASE, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1, "cycle_max_lr": 0.1}}},
     "scheduler.params.cycle_min_lr: 1.0 is above cycle_max_lr=0.1"),
    ({**BASE, "zero_optimization": {"offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param.device: parameter offload needs zero_optimization.stage 3 (stage is 0)"),
    ({**BASE, "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}},
     "zero_optimization.zero_hpz_partition_size: partitions parameters, so it needs "
     "zero_optimization.stage 3 (stage is 2)"),
    ({**BASE, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "mics_shard_size": 2}},
     "zero_optimization.zero_hpz_partition_size: hpZ and mics_shard_size are two ways"),
    ({**BASE, "zero_optimization": {"stage": 3, "mics_hierarchical_params_gather": True}},
     "zero_optimization.mics_hierarchical_params_gather: needs mics_shard_size > 0"),
    ({**BASE, "zero_optimization": {"stage": 3, "mics_shard_size": 2,
                                    "offload_param": {"device": "nvme", "nvme_path": "/x"}}},
     "zero_optimization.mics_shard_size: not supported with offload_param.device nvme"),
    ({**BASE, "zero_optimization": {"stage": 3, "mics_shard_size": 2, "zero_quantized_weights": True}},
     "zero_optimization.mics_shard_size: not supported with ZeRO++'s quantized weights"),
    ({**BASE, "fp16": {"enabled": True},
      "zero_optimization": {"stage": 3, "zero_quantized_gradients": True}},
     "zero_optimization.zero_quantized_gradients: quantized communication (ZeRO++) takes fp32 or "
     "bf16"),
])
def test_odd_input_gives_one_clear_problem_first(raw, expected):
    assert problems(raw)[0].startswith(expected)
