"""The DeepSpeed configuration key tree: every accepted key, its type, range, default and choices.

Defaults follow DeepSpeed's documented defaults (docs/_pages/config-json.md and its pydantic
models), so a config that works there means the same thing here. The tree is plain data; the
walker that checks a config against it is ``validate.py``.

Leniency, decided once for every field (see ``validate.check_leaf``):
- int fields accept integral floats (``5e8`` and ``2.0`` -> int): JSON has no int exponent form,
  and DeepSpeed's own docs write bucket sizes as ``5e8``.
- int and float fields accept numeric strings (``"1e-3"``): PyYAML reads ``1e-3`` (no dot) as a
  string, the most common YAML trap.
- bool fields accept ``0``/``1`` (DeepSpeed reads many flags with a plain ``if``), nothing else.
- a number is never accepted where a bool is expected and vice versa (``true`` is not a count).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Leaf:
    """One scalar (or small list) key."""

    kind: str  # "int" | "float" | "bool" | "str" | "floats" / "ints" (lists) | "any"
    default: Any = None
    low: Optional[float] = None  # inclusive bounds
    high: Optional[float] = None
    choices: Optional[tuple] = None  # allowed values (str kinds compare case-sensitively)
    length: Optional[int] = None  # for "floats": required list length
    required: bool = False
    infinity: bool = False  # an "int" that also takes +infinity (meaning "never")

    def describe(self) -> str:
        """What is allowed, for error messages."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) if c is not None else "null" for c in self.choices)
        names = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                 "any": "any value", "floats": f"a list of {self.length or 'several'} numbers",
                 "ints": f"a list of {self.length or 'several'} integers"}
        text = names[self.kind]
        if self.low is not None and self.high is not None:
            text += f" in [{_num(self.low)}, {_num(self.high)}]"
        elif self.low is not None:
            text += f" >= {_num(self.low)}"
        elif self.high is not None:
            text += f" <= {_num(self.high)}"
        return text


@dataclass(frozen=True)
class Section:
    """A mapping of keys. ``open`` sections also keep keys they do not list (passed through)."""

    fields: dict
    open: bool = False
    aliases: dict = field(default_factory=dict)  # deprecated or alternative spelling -> key
    optional: bool = False  # absent stays None (optimizer, scheduler) instead of filled with defaults
    fill: bool = True  # False: absent keys stay absent (optimizer params go to the class as given)


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else str(x)


def I(default=None, low=None, high=None, **kw):  # noqa: E743 - short names keep the table readable
    return Leaf("int", default, low, high, **kw)


def F(default=None, low=None, high=None, **kw):
    return Leaf("float", default, low, high, **kw)


def B(default=False):
    return Leaf("bool", default)


def S(default=None, choices=None, **kw):
    return Leaf("str", default, choices=choices, **kw)


DTYPES = ("fp32", "fp16", "bf16")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
BIG = int(5e8)


def _monitor(job="DeepSpeedJobName"):
    # output_path null (DeepSpeed's default): under the directory the job was launched from.
    return Section({"enabled": B(), "output_path": S(None), "job_name": S(job)})


def _enabled_open(**extra):
    """A section whose content belongs to a feature we only switch on/off (kept as given)."""
    return Section({"enabled": B(), **extra}, open=True)


OFFLOAD_PARAM = Section({
    "device": S("none", OFFLOAD_DEVICES),
    "nvme_path": S(None),
    "pin_memory": B(True),  # DeepSpeed's current default (it was false before)
    "buffer_count": I(5, 0),
    "buffer_size": I(int(1e8), 0),
    "max_in_cpu": I(int(1e9), 0),
})

OFFLOAD_OPTIMIZER = Section({
    "device": S("none", OFFLOAD_DEVICES),
    "nvme_path": S(None),
    "pin_memory": B(True),  # DeepSpeed's current default (it was false before)
    "buffer_count": I(4, 0),
    "pipeline_read": B(),
    "pipeline_write": B(),
    "fast_init": B(),
    "ratio": F(1.0, 0.0, 1.0),
})

ZERO = Section({
    "stage": I(0, 0, 3),
    "contiguous_gradients": B(True),
    "reduce_scatter": B(True),
    "reduce_bucket_size": I(BIG, 0),
    "use_multi_rank_bucket_allreduce": B(True),
    "allgather_partitions": B(True),
    "allgather_bucket_size": I(BIG, 0),
    "overlap_comm": Leaf("bool", None),  # None: DeepSpeed's dynamic default (true for stage 3)
    "load_from_fp32_weights": B(True),
    "elastic_checkpoint": B(),
    "offload_param": OFFLOAD_PARAM,
    "offload_optimizer": OFFLOAD_OPTIMIZER,
    "sub_group_size": I(int(1e9), 0),
    "cpu_offload": Leaf("bool", None),  # deprecated: offload_optimizer.device = cpu
    "cpu_offload_param": Leaf("bool", None),  # deprecated: offload_param.device = cpu
    "cpu_offload_use_pin_memory": Leaf("bool", None),  # deprecated: offload_*.pin_memory
    "stage3_prefetch_bucket_size": I(int(5e7), 0),
    "stage3_param_persistence_threshold": I(int(1e5), 0),
    "stage3_model_persistence_threshold": I(sys.maxsize, 0),
    "stage3_max_live_parameters": I(int(1e9), 0),
    "stage3_max_reuse_distance": I(int(1e9), 0),
    "stage3_gather_16bit_weights_on_model_save": B(),
    "stage3_module_granularity_threshold": I(0, 0),
    "stage3_use_all_reduce_for_fetch_params": B(),
    "ignore_unused_parameters": B(True),
    "legacy_stage1": B(),
    "round_robin_gradients": B(),
    "zero_hpz_partition_size": I(1, 1),
    "zero_quantized_weights": B(),
    "zero_quantized_nontrainable_weights": B(),
    "zero_quantized_gradients": B(),
    "zeropp_loco_param": Leaf("any", None),
    "mics_shard_size": I(-1, -1),
    "mics_hierarchical_params_gather": B(),
    "memory_efficient_linear": B(True),
    "pipeline_loading_checkpoint": B(),
    "override_module_apply": B(True),
    "log_trace_cache_warnings": B(),
    "enable_sanity_checks": B(),
    "compute_grad_norm": B(True),
    "parameter_alignment": B(),
    "save_muon_momentum_buffer_in_memory": B(),
    "stage3_allgather_sequential": B(),
    "stage3_partition_stream_chunk_size": I(0, 0),
    "zenflow": Leaf("any", None),
    "leaf_module": Leaf("any", None),
}, aliases={"stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save"})

# Optimizer params: a free dict (any torch.optim keyword passes through); these known ones are typed.
OPTIMIZER_PARAMS = Section({
    "lr": F(None, 0.0),
    "betas": Leaf("floats", None, 0.0, 1.0, length=2),
    "eps": F(None, 0.0),
    "weight_decay": F(None, 0.0),
    "momentum": F(None, 0.0),
    "dampening": F(None, 0.0),
    "nesterov": Leaf("bool", None),
    "amsgrad": Leaf("bool", None),
    "bias_correction": Leaf("bool", None),
    "adam_w_mode": Leaf("bool", None),
    "torch_adam": Leaf("bool", None),
    "max_coeff": F(None, 0.0),  # Lamb
    "min_coeff": F(None, 0.0),
    "freeze_step": I(None, 0),  # 1-bit Adam / 1-bit LAMB
    "var_freeze_step": I(None, 0),  # 0/1 Adam
    "var_update_scaler": I(None, 1),
    "local_step_scaler": I(None, 1),
    "local_step_clipper": I(None, 1),
    "cuda_aware": Leaf("bool", None),
    "comm_backend_name": S(None, ("nccl", "mpi", "gloo", "compressed", "hccl")),
    "coeff_beta": F(None, 0.0, 1.0),
    "factor_max": F(None, 0.0),
    "factor_min": F(None, 0.0),
    "factor_threshold": F(None, 0.0),
    "muon_lr": F(None, 0.0),  # Muon: lr of the Muon half / of the AdamW half
    "adam_lr": F(None, 0.0),
    "ns_method": S(None, ("gram", "standard")),
    "ns_steps": I(None, 1),  # dslaunch's (DeepSpeed's muon_update arguments)
    "ns_dtype": S(None, ("auto", "fp32", "bf16", "fp16", "fp64")),
    "per_head_muon": Leaf("bool", None),
}, open=True, fill=False)

OPTIMIZER = Section({
    "type": S(None, required=True),  # checked loosely by validate._check_optimizer
    "params": OPTIMIZER_PARAMS,
    "legacy_fusion": B(),
}, optional=True)

# DeepSpeed's optimizer names (lower-cased compare, as DeepSpeed does) -> canonical spelling.
DEEPSPEED_OPTIMIZERS = {n.lower(): n for n in (
    "Adam", "AdamW", "SGD", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion",
    "FusedAdam", "CPUAdam", "Muon", "MuAdam", "MuAdamW", "MuSGD")}
# torch.optim classes (so a near-miss like "AdamX" is caught without importing torch here).
TORCH_OPTIMIZERS = ("Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS",
                    "Muon", "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam")

_WARMUP = {
    "warmup_min_lr": F(0.0, 0.0),
    "warmup_max_lr": F(0.001, 0.0),
    "warmup_num_steps": I(1000, 0),
    "warmup_type": S("log", ("log", "linear")),
    "last_batch_iteration": I(-1, -1),
}

# Scheduler type -> its params (DeepSpeed's lr_schedules.py signatures and defaults).
SCHEDULER_PARAMS = {
    # WarmupLR's warmup_max_lr unset: each param group's own lr (DeepSpeed 0.19.8); WarmupDecayLR
    # keeps 0.001
    "WarmupLR": Section({**_WARMUP, "warmup_max_lr": F(None, 0.0)}),
    "WarmupDecayLR": Section({**_WARMUP, "total_num_steps": I(None, 1, required=True)}),
    "WarmupCosineLR": Section({
        "total_num_steps": I(None, 1, required=True),
        "warmup_min_ratio": F(0.0, 0.0, 1.0),
        "warmup_num_steps": I(1000, 0),
        "cos_min_ratio": F(0.0001, 0.0, 1.0),
        "warmup_type": S("log", ("log", "linear")),
        "last_batch_iteration": I(-1, -1),
    }),
    "OneCycle": Section({
        "cycle_min_lr": F(None, 0.0, required=True),
        "cycle_max_lr": F(None, 0.0, required=True),
        "decay_lr_rate": F(0.0, 0.0),
        "cycle_first_step_size": I(2000, 1),
        "cycle_second_step_size": I(None, 1),
        "cycle_first_stair_count": I(0, 0),
        "cycle_second_stair_count": I(None, 0),
        "decay_step_size": I(0, 0),
        "cycle_momentum": B(True),
        "cycle_min_mom": F(0.8, 0.0, 1.0),
        "cycle_max_mom": F(0.9, 0.0, 1.0),
        "decay_mom_rate": F(0.0, 0.0),
        "last_batch_iteration": I(-1, -1),
    }),
    "LRRangeTest": Section({
        "lr_range_test_min_lr": F(0.001, 0.0),
        "lr_range_test_step_size": I(2000, 1),
        "lr_range_test_step_rate": F(1.0, 0.0),
        "lr_range_test_staircase": B(),
        "last_batch_iteration": I(-1, -1),
    }),
}

SCHEDULER = Section({
    "type": S(None, tuple(SCHEDULER_PARAMS), required=True),
    "params": Leaf("any", None),  # checked against SCHEDULER_PARAMS[type] by validate.py
}, optional=True)

FP16 = Section({
    "enabled": B(),
    "auto_cast": B(),
    "loss_scale": F(0.0, 0.0),  # 0 = dynamic loss scaling
    "initial_scale_power": I(16, 0, 64),
    "loss_scale_window": I(1000, 1),
    "hysteresis": I(2, 1),
    "consecutive_hysteresis": B(),
    "min_loss_scale": F(1.0, 0.0),
    "fp16_master_weights_and_grads": B(),
})

BF16 = Section({"enabled": B(), "immediate_grad_update": B(), "check_grad_overflow": B(True),
                "bf16_master_weights_and_grads": B(), "bf16_optimizer_states": B()})

# DeepSpeed's dtype spellings (its DtypeEnum); null: the device's autocast default (bf16 on CPU)
AUTOCAST_DTYPES = ("bf16", "bfloat16", "torch.bfloat16", "fp16", "float16", "half", "torch.float16",
                   "fp32", "float32", "float", "torch.float32")
# lower_precision_safe_modules: a list of "package.module.Class" names (checked in resolve.py);
# null: DeepSpeed's default list (Linear, Conv1d/2d/3d)
TORCH_AUTOCAST = Section({"enabled": B(), "dtype": S(None, AUTOCAST_DTYPES),
                          "lower_precision_safe_modules": Leaf("any", None)})

ACTIVATION_CHECKPOINTING = Section({
    "partition_activations": B(),
    "cpu_checkpointing": B(),
    "contiguous_memory_optimization": B(),
    "number_checkpoints": I(None, 1),
    "synchronize_checkpoint_boundary": B(),
    "profile": B(),
})

AIO = Section({
    "block_size": I(1048576, 1),
    "queue_depth": I(8, 1),
    "intra_op_parallelism": I(1, 1),
    "single_submit": B(),
    "overlap_events": B(True),
    "use_gds": B(),
}, aliases={"thread_count": "intra_op_parallelism"})

CHECKPOINT = Section({
    "tag_validation": S("Warn", ("Ignore", "Warn", "Fail")),
    "load_universal": B(),
    "use_node_local_storage": B(),
    "parallel_write": Section({"pipeline_stage": B()}),
    # dslaunch's own (DeepSpeed has no such keys): write in the background; keep the newest N
    "async_save": B(),
    "keep_last": I(0, 0),  # 0: keep every checkpoint
})

# DeepSpeed's elastic training batch solver (config/elasticity.py); defaults as DeepSpeed's
ELASTICITY = Section({
    "enabled": B(),
    "max_train_batch_size": I(None, 1),
    "micro_batch_sizes": Leaf("any", None),  # a list of positive ints, checked in elasticity.py
    "min_gpus": I(1, 1),
    "max_gpus": I(10000, 1),
    "min_time": I(0, 0),
    "version": F(0.2, choices=(0.1, 0.2)),
    "ignore_non_elastic_batch_info": B(),
    "prefer_larger_batch": B(True),
    "model_parallel_size": I(1, 1),
    "num_gpus_per_node": I(1, 1),
})

PIPELINE = Section({
    "stages": I(1, 1),  # "auto" (DeepSpeed's default: taken from the PipelineModule) resolves to 1
    "partition_method": S("parameters"),  # "parameters" | "uniform" | "type:REGEX"
    "activation_checkpoint_interval": I(0, 0),
    "seed_layers": B(),
    "pipe_partitioned": B(True),
    "grad_partitioned": B(True),
}, aliases={"partition": "partition_method"})

TENSOR_PARALLEL = Section({
    "autotp_size": I(0, 0),  # DeepSpeed: 0 (or 1) means no tensor parallelism
    "tp_grain_size": I(1, 1),
    "preset_model": S(None),
    "tp_overlap_comm": B(),
    "vocab_parallel_lm_head": B(),
    "partition_config": Leaf("any", None),
}, open=True, aliases={"tp_size": "autotp_size"})

# AutoEP (DeepSpeed 2026): the experts of a Hugging Face MoE model spread over autoep_size ranks.
# Open: DeepSpeed's kernel and routing-override keys are kept as given, and unused.
EXPERT_PARALLEL = Section({
    "enabled": B(),
    "autoep_size": I(1, 1),
    "preset_model": S(None, (None, "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_5_moe",
                             "deepseek_v2", "deepseek_v3")),  # = engine/parallel/moe/auto_ep.py PRESETS
}, open=True)

# read by `dslaunch autotune` (dslaunch/autotune/); a trial's config (enabled + metric_path) makes the
# engine measure steps start_profile_step..end_profile_step, write the metric file and exit
AUTOTUNING = Section({
    "enabled": B(),
    "fast": B(True),
    "results_dir": S("autotuning_results"),
    "exps_dir": S("autotuning_exps"),
    "overwrite": B(True),
    "start_profile_step": I(3, 1),
    "end_profile_step": I(5, 1),
    "metric_path": S(None),
    "metric": S("throughput", ("throughput", "latency", "flops")),
    "tuner_type": S("gridsearch", ("gridsearch", "random", "model_based")),
    "tuner_early_stopping": I(5, 1),
    "tuner_num_trials": I(50, 1),
    "arg_mappings": Leaf("any", None),  # {"config key": "--script-flag"}
    "model_info": Leaf("any", None),
    "model_info_path": S(None),
    "mp_size": I(1, 1),
    "max_train_batch_size": I(None, 1),
    "min_train_batch_size": I(1, 1),
    "max_train_micro_batch_size_per_gpu": I(1024, 1),
    "min_train_micro_batch_size_per_gpu": I(1, 1),
    "num_tuning_micro_batch_sizes": I(3, 1),
}, aliases={"start_step": "start_profile_step", "end_step": "end_profile_step"})

SPARSE_ATTENTION = Section({
    "mode": S("fixed", ("dense", "fixed", "variable", "bigbird", "bslongformer", "local")),
    "block": I(16, 1),
    "different_layout_per_head": B(),
    "num_local_blocks": I(4, 1),  # fixed
    "num_global_blocks": I(1, 1),  # fixed, bigbird
    "attention": S("bidirectional", ("unidirectional", "bidirectional")),
    "horizontal_global_attention": B(),  # fixed, variable
    "num_different_global_patterns": I(1, 1),  # fixed
    "num_random_blocks": I(0, 0),  # variable, bigbird (bigbird's own default is 1)
    "local_window_blocks": Leaf("ints", [4], low=1),  # variable
    "global_block_indices": Leaf("ints", [0], low=0),  # variable, bslongformer
    "global_block_end_indices": Leaf("ints", None, low=1),  # variable, bslongformer
    "num_sliding_window_blocks": I(3, 1),  # bigbird, bslongformer, local
}, optional=True)

TOP = Section({
    "train_batch_size": I(None, 1),
    "train_micro_batch_size_per_gpu": I(None, 1),
    "gradient_accumulation_steps": I(None, 1),
    "managed_gradient_accumulation": B(True),
    "optimizer": OPTIMIZER,
    "scheduler": SCHEDULER,
    "fp16": FP16,
    "bf16": BF16,
    "amp": _enabled_open(),
    "torch_autocast": TORCH_AUTOCAST,
    "gradient_clipping": F(1.0, 0.0),  # DeepSpeed 0.19.8 clips at 1.0 when the key is absent
    "prescale_gradients": B(),
    "gradient_allreduce_op": S("mean", ("mean", "sum")),
    "gradient_predivide_factor": F(1.0, 0.0),
    "sparse_gradients": B(),
    "zero_optimization": ZERO,
    "zero_allow_untested_optimizer": B(),
    "zero_force_ds_cpu_optimizer": B(True),
    # unset: no step log line, as DeepSpeed 0.19.8 (STEPS_PER_PRINT_DEFAULT = None; older
    # DeepSpeed printed every 10 steps). Accelerate writes float("inf") for the same
    "steps_per_print": I(None, 1, infinity=True),
    "wall_clock_breakdown": B(),
    "dump_state": B(),
    "memory_breakdown": B(),
    "disable_allgather": B(),
    "disable_python_gc": B(),
    "communication_data_type": S(None, DTYPES + (None,)),
    "seq_parallel_communication_data_type": S("fp32", DTYPES),
    "gradient_accumulation_dtype": S(None, DTYPES + (None,)),
    "data_types": Section({"grad_accum_dtype": S(None, DTYPES + (None,))}),
    "sequence_parallel_size": I(1, 1),
    "csv_monitor": _monitor(),
    "tensorboard": _monitor(),
    "wandb": Section({"enabled": B(), "group": S(None), "team": S(None), "project": S("deepspeed")}),
    "comet": Section({"enabled": B(), "samples_log_interval": I(100, 1), "project": S(None),
                      "workspace": S(None), "api_key": S(None), "experiment_name": S(None),
                      "experiment_key": S(None), "online": Leaf("bool", None),
                      "mode": S(None, (None, "get", "create", "get_or_create"))}),
    "flops_profiler": Section({
        "enabled": B(), "recompute_fwd_factor": F(0.0, 0.0), "profile_step": I(1, 1),
        "module_depth": I(-1, -1), "top_modules": I(1, 1), "detailed": B(True), "output_file": S(None)}),
    # DeepSpeed's communication logger (dslaunch/engine/observe/comms_logger.py); prof_ops: op names
    "comms_logger": Section({"enabled": B(), "verbose": B(), "prof_all": B(True),
                             "prof_ops": Leaf("any", None), "debug": B()}),
    "timers": Leaf("any", None),
    "activation_checkpointing": ACTIVATION_CHECKPOINTING,
    "aio": AIO,
    "checkpoint": CHECKPOINT,
    "pipeline": PIPELINE,
    "tensor_parallel": TENSOR_PARALLEL,
    "elasticity": ELASTICITY,
    "compression_training": Leaf("any", None),  # large nested tree; its use is caught in features.py
    "data_efficiency": _enabled_open(),
    # the legacy seqlen curriculum (engine/features/curriculum.py; its schedule keys checked there)
    "curriculum_learning": Section({
        "enabled": B(), "curriculum_type": S("seqlen"), "min_difficulty": I(None, 0),
        "max_difficulty": I(None, 0),
        "schedule_type": S(None, ("fixed_linear", "fixed_root", "fixed_discrete", "custom")),
        "schedule_config": Section({}, open=True)}),
    # theta: the keep probability the schedule decays to; gamma: how fast (DeepSpeed's keys and
    # defaults, engine/features/progressive_layer_drop.py)
    "progressive_layer_drop": Section({"enabled": B(), "theta": F(1.0, 0.0, 1.0),
                                       "gamma": F(0.001, 0.0)}),
    # each block's dominant Hessian eigenvalue every gas_boundary_resolution-th boundary
    # (engine/features/eigenvalue.py; DeepSpeed's keys and defaults, which it reads under quantize_training)
    "eigenvalue": Section({"enabled": B(), "verbose": B(), "max_iter": I(100, 1),
                           "tol": F(1e-2, 0.0), "stability": F(1e-6, 0.0),
                           "gas_boundary_resolution": I(1, 1),
                           "layer_name": S("bert.encoder.layer"), "layer_num": I(0, 0)}),
    # DeepSpeed 0.18's block-sparse attention layout (0.19 removed it); the model builds its
    # layout from it (dslaunch.engine.features.sparse_attention.modules.sparsity_config_from_dict); each
    # mode reads its own keys, as DeepSpeed's; "local" (LocalSlidingWindow) is dslaunch's
    "sparse_attention": SPARSE_ATTENTION,
    "autotuning": AUTOTUNING,
    "hybrid_engine": _enabled_open(),
    "nebula": _enabled_open(),
    "compile": Section({"deepcompile": B()}, open=True),
    "expert_parallel": EXPERT_PARALLEL,
    # dslaunch's own (DeepSpeed has no such key): read by `dslaunch run`, ignored by the engine
    "fault_tolerance": Section({
        "hang_timeout": F(300.0, 0.0),  # seconds without progress before the job stops; 0: off
        # what a failure costs: "restart" every rank, or "in-process" (survivors keep running)
        "recover": S("restart", ("restart", "in-process")),
    }),
    "dslaunch": Section({  # dslaunch's own settings (DeepSpeed has no such key)
        "pipe_schedule": S("1f1b", ("1f1b", "gpipe")),
    }, open=True),
}, aliases={"bfloat16": "bf16"})


# Top-level keys only a DeepSpeed config has. The names other configs use too (``optimizer``,
# ``scheduler``, ``fp16``, ``bf16``, ``gradient_accumulation_steps``: HF TrainingArguments,
# Lightning and many model configs have them) are left out on purpose.
DEEPSPEED_ONLY_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
    "wall_clock_breakdown", "prescale_gradients", "gradient_predivide_factor",
    "communication_data_type", "comms_logger", "flops_profiler", "fault_tolerance",
})


def looks_like_deepspeed(data) -> bool:
    """Whether a mapping read from a file that a script takes as its own ``--config`` is a
    DeepSpeed config (``dslaunch run`` then checks it before any rank starts): it names at least
    one of ``DEEPSPEED_ONLY_KEYS`` and at least half of its top-level keys are DeepSpeed's (a
    dotted key counts by its first part). A model or trainer config that happens to share a
    name or two is left to the script."""
    if not isinstance(data, dict) or not data:
        return False
    heads = [TOP.aliases.get(k.split(".", 1)[0], k.split(".", 1)[0]) for k in data
             if isinstance(k, str)]
    known = sum(1 for k in heads if k in TOP.fields)
    return any(k in DEEPSPEED_ONLY_KEYS for k in heads) and 2 * known >= len(data)


def all_key_paths(section: Section = TOP, prefix: str = "") -> list[str]:
    """Every dotted key path of the tree (used to suggest a key that sits in another section)."""
    out = []
    for name, spec in section.fields.items():
        path = prefix + name
        out.append(path)
        if isinstance(spec, Section):
            out.extend(all_key_paths(spec, path + "."))
    return out
