"""DeepSpeed name -> dslaunch object: the one table behind the public faces.

Every DeepSpeed name that real downstream code imports (Transformers, Accelerate, Lightning, TRL,
the RLHF stacks, DeepSpeedExamples: ranked in the project's porting guide) has one row here:

- ``ours`` is where dslaunch keeps it (``"dslaunch.zero:GatheredParameters"``), or None while we
  do not provide it; ``why`` then says what brings it (an issue) or what to use instead.
- The public faces (``dslaunch/zero.py``, ``dslaunch/comm.py``, ...) re-export the present names;
  asking a face for a missing one raises an AttributeError with ``why`` (``missing_attribute``),
  and importing a missing module (``dslaunch.moe``) an ImportError with it (``missing_modules.py``),
  never a bare "No module named".
- ``docs/porting.md`` is generated from this table (``python -m dslaunch.deepspeed_names``), and
  a test checks that every present row resolves and that the page is up to date.
- The ``--as-deepspeed`` alias (frameworks issue) maps ``deepspeed.X`` to ``dslaunch.X`` from it.

Plain data: importing this module imports nothing else of dslaunch.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Name:
    deepspeed: str  # the dotted name as DeepSpeed users write it
    ours: Optional[str]  # "module:attribute" (or "module" for a module), None when missing
    why: str = ""  # missing: what brings it or what to use; present: how ours differs

    @property
    def present(self) -> bool:
        return self.ours is not None

    @property
    def dslaunch_name(self) -> str:
        """The name a ported script writes: ``deepspeed.X`` -> ``dslaunch.X``."""
        return "dslaunch" + self.deepspeed[len("deepspeed"):]


def _present(deepspeed: str, ours: str, why: str = "") -> Name:
    return Name(deepspeed, ours, why)


def _missing(deepspeed: str, why: str) -> Name:
    return Name(deepspeed, None, why)


# The DeepSpeed release whose API this table follows (read from its source); the --as-deepspeed
# alias reports it as the `deepspeed` version, so frameworks' version gates take its code paths.
DEEPSPEED_VERSION = "0.19.8"

AUTOTP = ("not provided: AutoTP training is the config key tensor_parallel.autotp_size (or "
          "deepspeed.tp_model_init), applied by initialize (engine/parallel/autotp.py); DeepSpeed's "
          "injection internals are not mirrored")
INFERENCE = "not planned: dslaunch is a training runtime (no inference engine)"
API = "comes with issue 18 (DeepSpeed's public API), in progress"
UCP = ("not provided: DeepSpeed's checkpoint-conversion internals; a universal checkpoint "
       "(ds_to_universal.py's output) loads with checkpoint.load_universal, `dslaunch ckpt "
       "to-universal` writes one (engine/checkpoint/universal.py); dslaunch checkpoints load at "
       "another world size as they are")
COLLECTIVE = "collective under ZeRO 1-3: every data-parallel rank calls it, in the same order"
LOCAL = ("this rank's elements of the parameter, 1-D, under ZeRO 1-3 (DeepSpeed: ZeRO-3 only); "
         "None under stage 0")

OP_BUILDER_FILES = ("DeepSpeed's per-op and per-accelerator builder files; import the builders "
                    "from deepspeed.ops.op_builder (AsyncIOBuilder, CPUAdamBuilder, ...)")
OPS_FILES = ("DeepSpeed's file behind the optimizer class; import the class from its package "
             "(deepspeed.ops.adam.DeepSpeedCPUAdam, ...): the same class")
ENGINE_INTERNAL = ("DeepSpeed's engine internals (optimizer wrappers, config classes, swappers, "
                   "checkpoint engines): dslaunch's engine is its own; scripts use the engine's "
                   "methods and the config dict")
ZERO_INTERNAL = ("DeepSpeed's ZeRO internals (its optimizer classes, parameter coordinator, config "
                 "models): dslaunch's ZeRO is its own; use deepspeed.zero's names, "
                 "deepspeed.utils' safe_get_* and the engine's methods")
UTILS_INTERNAL = ("DeepSpeed's internal helpers; the deepspeed.utils names scripts use (logger, "
                  "log_dist, groups, safe_get_full_*, set_z3_leaf_modules, ...) are provided")
COMM_INTERNAL = ("DeepSpeed's communication backends and their helpers; deepspeed.comm's functions "
                 "(torch.distributed underneath) are the interface")
ZENFLOW = "not planned yet: DeepSpeed's ZenFlow (stall-free CPU offload)"


def _all_missing(parent: str, names: str, why: str) -> list:
    """Missing rows ``<parent>.<name>`` for each name of ``names`` (space-separated)."""
    return [_missing(f"{parent}.{name}", why) for name in names.split()]


def _groups(axis: str, why: str = "") -> list:
    """The three accessors DeepSpeed's ``utils.groups`` has per parallel axis."""
    return [_present(f"deepspeed.utils.groups._get_{axis}_{what}",
                     f"dslaunch.engine.parallel.groups:_get_{axis}_{what}", why)
            for what in ("group", "world_size", "rank")]

# Grouped by face; within a group, in the order of DeepSpeed's documentation.
NAMES: list[Name] = [
    # -- deepspeed ------------------------------------------------------------------------------
    _present("deepspeed.initialize", "dslaunch.engine.api:initialize"),
    _present("deepspeed.init_distributed", "dslaunch.engine.comm.collectives:init_distributed"),
    _present("deepspeed.add_config_arguments", "dslaunch.engine.api:add_config_arguments"),
    _present("deepspeed.DeepSpeedEngine", "dslaunch.engine.core.engine:DSLaunchEngine",
             "dslaunch's engine class; isinstance checks against this name hold"),
    _present("deepspeed.__version__", "dslaunch:__version__",
             "dslaunch's own version; under --as-deepspeed `deepspeed.__version__` and the "
             "`deepspeed` package metadata are the DeepSpeed release the table follows, with "
             "dslaunch's version as the local label (0.19.8+dslaunch.0.1.0), so frameworks' "
             "version gates pass (docs/frameworks.md)"),
    _present("deepspeed.tp_model_init", "dslaunch.engine.parallel.autotp:tp_model_init",
             "records tp_size (and casts to dtype); initialize splits the model's attention and "
             "MLP linears (Llama, Qwen2/3, Mistral, Gemma, Phi, GPT-2, GPT-NeoX) over the data x "
             "model grid; tp_group= refused; ZeRO-3 composes (its checkpoints resume at any TP "
             "and data-parallel size, and convert with to-fp32 / to-universal)"),
    _missing("deepspeed.init_inference", INFERENCE),
    # -- deepspeed.zero ---------------------------------------------------------------------------
    _present("deepspeed.zero", "dslaunch.zero"),
    _present("deepspeed.zero.Init", "dslaunch.engine.zero.zero_init:Init"),
    _present("deepspeed.zero.GatheredParameters", "dslaunch.engine.zero.zero_init:GatheredParameters"),
    _present("deepspeed.zero.register_external_parameter",
             "dslaunch.engine.zero.zero_init:register_external_parameter"),
    _present("deepspeed.zero.unregister_external_parameter",
             "dslaunch.engine.zero.zero_init:unregister_external_parameter"),
    _present("deepspeed.zero.TiledLinear", "dslaunch.engine.zero.tiled_linear:TiledLinear",
             "each tile is a module of its own, so stage 3 gathers one tile at a time"),
    # -- deepspeed.pipe ---------------------------------------------------------------------------
    _present("deepspeed.pipe", "dslaunch.pipe"),
    _present("deepspeed.pipe.PipelineModule", "dslaunch.engine.parallel.pipe.module:PipelineModule"),
    _present("deepspeed.pipe.LayerSpec", "dslaunch.engine.parallel.pipe.module:LayerSpec"),
    _present("deepspeed.pipe.TiedLayerSpec", "dslaunch.engine.parallel.pipe.module:TiedLayerSpec"),
    _present("deepspeed.pipe.ProcessTopology", "dslaunch.engine.parallel.topology:ProcessTopology"),
    _present("deepspeed.pipe.PipeDataParallelTopology",
             "dslaunch.engine.parallel.topology:PipeDataParallelTopology"),
    _present("deepspeed.pipe.PipeModelDataParallelTopology",
             "dslaunch.engine.parallel.topology:PipeModelDataParallelTopology"),
    # -- deepspeed.comm ---------------------------------------------------------------------------
    _present("deepspeed.comm", "dslaunch.comm",
             "torch.distributed's semantics; every call is booked with the engine's collectives "
             "(engine.comm_stats(), log_summary())"),
    _present("deepspeed.comm.init_distributed", "dslaunch.engine.comm.collectives:init_distributed",
             "the same function as deepspeed.init_distributed; config= (a dict) switches the "
             "comms logger from its comms_logger section; verbose defaults to False"),
    _present("deepspeed.comm.is_initialized", "dslaunch.engine.comm.api:is_initialized"),
    _present("deepspeed.comm.is_available", "dslaunch.engine.comm.api:is_available"),
    _present("deepspeed.comm.get_rank", "dslaunch.engine.comm.api:get_rank"),
    _present("deepspeed.comm.get_world_size", "dslaunch.engine.comm.api:get_world_size"),
    _present("deepspeed.comm.get_local_rank", "dslaunch.engine.comm.api:get_local_rank",
             "LOCAL_RANK (or MPI's / SLURM's) from the environment"),
    _present("deepspeed.comm.get_global_rank", "dslaunch.engine.comm.api:get_global_rank"),
    _present("deepspeed.comm.new_group", "dslaunch.engine.comm.api:new_group", "torch's"),
    _present("deepspeed.comm.get_backend", "dslaunch.engine.comm.api:get_backend"),
    _present("deepspeed.comm.destroy_process_group",
             "dslaunch.engine.comm.api:destroy_process_group"),
    _present("deepspeed.comm.barrier", "dslaunch.engine.comm.api:barrier"),
    _present("deepspeed.comm.monitored_barrier", "dslaunch.engine.comm.api:monitored_barrier",
             "torch's (gloo)"),
    _present("deepspeed.comm.all_reduce", "dslaunch.engine.comm.api:all_reduce"),
    _present("deepspeed.comm.inference_all_reduce",
             "dslaunch.engine.comm.api:inference_all_reduce", "the same as all_reduce"),
    _present("deepspeed.comm.reduce", "dslaunch.engine.comm.api:reduce"),
    _present("deepspeed.comm.broadcast", "dslaunch.engine.comm.api:broadcast"),
    _present("deepspeed.comm.all_gather", "dslaunch.engine.comm.api:all_gather",
             "the list form"),
    _present("deepspeed.comm.all_gather_into_tensor",
             "dslaunch.engine.comm.api:all_gather_into_tensor",
             "on gloo the engine's faster path (DSLAUNCH_GLOO_COLLECTIVES); same results"),
    _present("deepspeed.comm.allgather_fn", "dslaunch.engine.comm.api:allgather_fn",
             "the same as all_gather_into_tensor"),
    _present("deepspeed.comm.reduce_scatter_tensor",
             "dslaunch.engine.comm.api:reduce_scatter_tensor",
             "on gloo the engine's faster path (DSLAUNCH_GLOO_COLLECTIVES); same results"),
    _present("deepspeed.comm.reduce_scatter_fn", "dslaunch.engine.comm.api:reduce_scatter_fn",
             "the same as reduce_scatter_tensor"),
    _present("deepspeed.comm.all_to_all_single", "dslaunch.engine.comm.api:all_to_all_single"),
    _present("deepspeed.comm.gather", "dslaunch.engine.comm.api:gather"),
    _present("deepspeed.comm.scatter", "dslaunch.engine.comm.api:scatter"),
    _present("deepspeed.comm.send", "dslaunch.engine.comm.api:send"),
    _present("deepspeed.comm.recv", "dslaunch.engine.comm.api:recv"),
    _present("deepspeed.comm.isend", "dslaunch.engine.comm.api:isend"),
    _present("deepspeed.comm.irecv", "dslaunch.engine.comm.api:irecv"),
    _present("deepspeed.comm.ReduceOp", "dslaunch.engine.comm.api:ReduceOp",
             "torch.distributed.ReduceOp (the same member names)"),
    _present("deepspeed.comm.ProcessGroup", "dslaunch.engine.comm.api:ProcessGroup",
             "torch.distributed.ProcessGroup"),
    _present("deepspeed.comm.has_all_gather_into_tensor",
             "dslaunch.engine.comm.api:has_all_gather_into_tensor"),
    _present("deepspeed.comm.has_reduce_scatter_tensor",
             "dslaunch.engine.comm.api:has_reduce_scatter_tensor"),
    _present("deepspeed.comm.log_summary", "dslaunch.engine.comm.api:log_summary",
             "prints the comms logger's table (per op and message size: count, latency, algbw, "
             "busbw) and this rank's calls, bytes, bytes sent and seconds per group; the "
             "return_dict adds 'booked' (those per group); show_straggler=True adds DeepSpeed's "
             "straggler breakdown"),
    _present("deepspeed.comm.configure", "dslaunch.engine.comm.api:configure",
             "deepspeed_config= takes a config dict, the engine's typed config or the "
             "comms_logger section"),
    _present("deepspeed.comm.reset_log", "dslaunch.engine.comm.api:reset_log"),
    _present("deepspeed.comm.has_comm_data", "dslaunch.engine.comm.api:has_comm_data"),
    _present("deepspeed.comm.get_comm_operation_count",
             "dslaunch.engine.comm.api:get_comm_operation_count"),
    _present("deepspeed.comm.get_logged_comm_ops", "dslaunch.engine.comm.api:get_logged_comm_ops"),
    _present("deepspeed.comm.comms_logger", "dslaunch.engine.observe.comms_logger:COMMS_LOGGER",
             "the process's CommsLogger; ops are recorded under the names engine.comm_stats() "
             "uses (all_gather, reduce_scatter, ...)"),
    _missing("deepspeed.comm.TorchBackend",
             "not provided: DeepSpeed's backend class; call the module's functions "
             "(dslaunch.comm.all_reduce, ...), which run torch.distributed"),
    # -- deepspeed.accelerator --------------------------------------------------------------------
    _present("deepspeed.get_accelerator", "dslaunch.accelerator.real_accelerator:get_accelerator",
             "the same function as deepspeed.accelerator.get_accelerator"),
    _present("deepspeed.accelerator", "dslaunch.accelerator",
             "CPU (gloo) and CUDA (NCCL) only; a real module that the engine uses too"),
    _present("deepspeed.accelerator.get_accelerator",
             "dslaunch.accelerator.real_accelerator:get_accelerator",
             "chosen once per process: CUDA if available, else CPU; DSLAUNCH_ACCELERATOR (or "
             "DS_ACCELERATOR) = cpu or cuda overrides. On CPU memory figures are the process's RSS "
             "and its peak; get_op_builder knows dslaunch's ops (CPUAdam, CPUAdagrad, CPULion, "
             "AsyncIO, FusedAdam builders) and answers None for the others"),
    _present("deepspeed.accelerator.set_accelerator",
             "dslaunch.accelerator.real_accelerator:set_accelerator",
             "takes a dslaunch Accelerator (dslaunch.accelerator.Accelerator subclass)"),
    _present("deepspeed.accelerator.real_accelerator", "dslaunch.accelerator.real_accelerator"),
    _present("deepspeed.accelerator.real_accelerator.get_accelerator",
             "dslaunch.accelerator.real_accelerator:get_accelerator"),
    _present("deepspeed.accelerator.real_accelerator.set_accelerator",
             "dslaunch.accelerator.real_accelerator:set_accelerator"),
    # -- deepspeed.ops ----------------------------------------------------------------------------
    _present("deepspeed.ops", "dslaunch.ops",
             "the optimizers (adam, adagrad, lion, lamb), the op builders (op_builder) "
             "of dslaunch's compiled ops, which dslaunch.kernels builds, and sparse_attention"),
    _present("deepspeed.ops.adam", "dslaunch.ops.adam"),
    _present("deepspeed.ops.adam.DeepSpeedCPUAdam", "dslaunch.engine.optim.cpu_adam:DSCPUAdam",
             "DeepSpeed's signature; CPU parameters only (fp32 or bf16, fp32 states); when the "
             "op cannot be built it warns once and runs the same formula in torch ops "
             "(`.compiled` is False)"),
    _present("deepspeed.ops.adam.FusedAdam", "dslaunch.engine.optim.fused:FusedAdam",
             "CPU parameters: the compiled CPU Adam (as DeepSpeed's CPU accelerator does); "
             "CUDA: torch's fused Adam/AdamW kernel, where bias_correction=False is an error"),
    _present("deepspeed.ops.adagrad", "dslaunch.ops.adagrad"),
    _present("deepspeed.ops.adagrad.DeepSpeedCPUAdagrad",
             "dslaunch.engine.optim.cpu_adam:DSCPUAdagrad",
             "DeepSpeed's signature plus torch's lr_decay and initial_accumulator_value "
             "(keyword-only); CPU parameters only"),
    _present("deepspeed.ops.lion", "dslaunch.ops.lion"),
    _present("deepspeed.ops.lion.DeepSpeedCPULion", "dslaunch.engine.optim.cpu_adam:DSCPULion",
             "DeepSpeed's signature; CPU parameters only"),
    _present("deepspeed.ops.lion.FusedLion", "dslaunch.engine.optim.fused:FusedLion",
             "CPU parameters: the compiled CPU Lion; CUDA: torch ops"),
    _present("deepspeed.ops.lamb", "dslaunch.ops.lamb"),
    _present("deepspeed.ops.lamb.FusedLamb", "dslaunch.engine.optim.lamb:Lamb",
             "torch ops on any device (no compiled op); max_grad_norm is accepted and not "
             "applied: clip with gradient_clipping"),
    _present("deepspeed.ops.op_builder", "dslaunch.ops.op_builder",
             "the builders of dslaunch's ops by DeepSpeed's class names; `load()` returns "
             "dslaunch's op module (AsyncIOBuilder: one with `aio_handle`)"),
    _present("deepspeed.ops.op_builder.AsyncIOBuilder",
             "dslaunch.ops.op_builder:AsyncIOBuilder",
             "`.load().aio_handle(block_size, queue_depth, single_submit, overlap_events, "
             "intra_op_parallelism)` is dslaunch.nvme.aio.AsyncIOHandle: DeepSpeed's calls "
             "(sync_/async_pread, pwrite, read, write, wait, new_cpu_locked_tensor, ...) on "
             "host tensors; kernel AIO or a thread pool, O_DIRECT where the file system allows"),
    *[_present(f"deepspeed.ops.op_builder.{name}", f"dslaunch.ops.op_builder:{name}", why)
      for name, why in (
        ("PinMemoryBuilder", "`.load().pin_handle()`: page-aligned, mlock'ed host tensors "
         "(new_cpu_locked_tensor, free_cpu_locked_tensor, is_pinned), shared with the aio "
         "handles"),
        ("CPUAdamBuilder", "`.load()` is dslaunch's compiled op, not DeepSpeed's binding "
         "(use deepspeed.ops.adam.DeepSpeedCPUAdam to step)"),
        ("CPUAdagradBuilder", "as CPUAdamBuilder"), ("CPULionBuilder", "as CPUAdamBuilder"),
        ("FusedAdamBuilder", "the CUDA multi-tensor Adam; is_compatible() is False without a "
         "GPU"),
        ("GDSBuilder", "importable; is_compatible() is False and load() says to use "
         "AsyncIOBuilder: dslaunch has no GPUDirect Storage op"),
        ("FusedLambBuilder", "importable; no compiled op: load() points to "
         "deepspeed.ops.lamb.FusedLamb"),
        ("FusedLionBuilder", "importable; no compiled op: load() points to "
         "deepspeed.ops.lion.FusedLion"))],
    *[_missing(f"deepspeed.ops.op_builder.{name}", OP_BUILDER_FILES) for name in (
        "async_io", "builder", "cpu", "dc", "evoformer_attn", "fp_quantizer", "fused_adam",
        "fused_lamb", "fused_lion", "gds", "hpu", "inference_core_ops",
        "inference_cutlass_builder", "klxpu", "mlu", "mps", "npu", "pin_memory",
        "pin_memory_load", "quantizer", "ragged_ops", "ragged_utils", "random_ltd", "sdaa",
        "spatial_inference", "stochastic_transformer", "supa", "transformer",
        "transformer_inference", "utils", "xpu")],
    _present("deepspeed.ops.sparse_attention", "dslaunch.ops.sparse_attention",
             "DeepSpeed 0.18's (0.19 removed it); runs on the CPU without Triton, in fp32, "
             "bf16 or fp16 (DeepSpeed: fp16 on a GPU only)"),
    *[_present(f"deepspeed.ops.sparse_attention.{name}",
               f"dslaunch.engine.features.sparse_attention.layouts:{name}",
               "make_layout(seq_len) equals DeepSpeed 0.18's")
      for name in ("SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig",
                   "VariableSparsityConfig", "BigBirdSparsityConfig",
                   "BSLongformerSparsityConfig", "LocalSlidingWindowSparsityConfig")],
    _present("deepspeed.ops.sparse_attention.SparseSelfAttention",
             "dslaunch.engine.features.sparse_attention.modules:SparseSelfAttention",
             "computes scores, softmax and context on the layout's kept blocks only (a "
             "compiled CPU op, or torch gathers per chunk of block rows; the backward "
             "recomputes, keeping no seq^2 tensor); rpe, key-padding and attention masks as "
             "DeepSpeed's softmax applies them"),
    _present("deepspeed.ops.sparse_attention.BertSparseSelfAttention",
             "dslaunch.engine.features.sparse_attention.modules:BertSparseSelfAttention"),
    _present("deepspeed.ops.sparse_attention.SparseAttentionUtils",
             "dslaunch.engine.features.sparse_attention.utils:SparseAttentionUtils",
             "replace_model_self_attention_with_sparse_self_attention works on Hugging Face "
             "BERT/RoBERTa (DeepSpeed's calls a method the model lacks)"),
    _present("deepspeed.ops.random_ltd", "dslaunch.ops.random_ltd",
             "torch ops on any device (DeepSpeed's need its CUDA RandomLTDBuilder op)"),
    _present("deepspeed.ops.random_ltd.dropping_utils", "dslaunch.ops.random_ltd.dropping_utils"),
    *[_present(f"deepspeed.ops.random_ltd.{name}", f"dslaunch.engine.features.random_ltd.tokens:{name}")
      for name in ("gpt_sample_tokens", "bert_sample_tokens", "GatherTokens", "ScatterTokens")],
    _missing("deepspeed.ops.transformer",
             "not planned: DeepSpeed's fused transformer-layer kernels "
             "(DeepSpeedTransformerLayer)"),
    # -- deepspeed.utils -------------------------------------------------------------------------
    _present("deepspeed.utils", "dslaunch.utils"),
    _present("deepspeed.utils.logger", "dslaunch.engine.base.log:logger",
             "one logging.Logger named 'dslaunch' (stdout, INFO, not propagated to the root "
             "logger); setLevel works as on DeepSpeed's"),
    _present("deepspeed.utils.log_dist", "dslaunch.engine.base.log:log_dist",
             "DeepSpeed's rule: in a distributed job only the ranks listed log ([-1]: all; "
             "None: none)"),
    _present("deepspeed.utils.logging", "dslaunch.utils.logging"),
    _present("deepspeed.utils.logging.logger", "dslaunch.engine.base.log:logger"),
    _present("deepspeed.utils.logging.log_dist", "dslaunch.engine.base.log:log_dist"),
    _present("deepspeed.utils.RepeatingLoader", "dslaunch.engine.base.dataloader:RepeatingLoader"),
    _present("deepspeed.utils.set_z3_leaf_modules",
             "dslaunch.engine.zero.leaf_modules:set_z3_leaf_modules",
             "mark before dslaunch.initialize: ZeRO-3 then gathers a leaf module's whole subtree "
             "as one unit"),
    _present("deepspeed.utils.unset_z3_leaf_modules",
             "dslaunch.engine.zero.leaf_modules:unset_z3_leaf_modules"),
    _present("deepspeed.utils.z3_leaf_module", "dslaunch.engine.zero.leaf_modules:z3_leaf_module"),
    _present("deepspeed.utils.get_z3_leaf_modules",
             "dslaunch.engine.zero.leaf_modules:get_z3_leaf_modules"),
    _present("deepspeed.utils.safe_get_full_fp32_param",
             "dslaunch.engine.zero.param_access:safe_get_full_fp32_param", COLLECTIVE),
    _present("deepspeed.utils.safe_set_full_fp32_param",
             "dslaunch.engine.zero.param_access:safe_set_full_fp32_param",
             "every rank passes the same value"),
    _present("deepspeed.utils.safe_get_full_grad",
             "dslaunch.engine.zero.param_access:safe_get_full_grad",
             COLLECTIVE + "; the averaged gradient between a boundary's backward and step(), "
             "fp16 loss scale divided out"),
    _present("deepspeed.utils.safe_get_full_optimizer_state",
             "dslaunch.engine.zero.param_access:safe_get_full_optimizer_state", COLLECTIVE),
    _present("deepspeed.utils.safe_set_full_optimizer_state",
             "dslaunch.engine.zero.param_access:safe_set_full_optimizer_state",
             "every rank passes the same value; not with optimizer states on NVMe"),
    _present("deepspeed.utils.safe_get_local_fp32_param",
             "dslaunch.engine.zero.param_access:safe_get_local_fp32_param", LOCAL),
    _present("deepspeed.utils.safe_get_local_grad",
             "dslaunch.engine.zero.param_access:safe_get_local_grad", LOCAL),
    _present("deepspeed.utils.safe_get_local_optimizer_state",
             "dslaunch.engine.zero.param_access:safe_get_local_optimizer_state", LOCAL),
    _missing("deepspeed.utils.timer", "not planned yet: DeepSpeed's (and Megatron-DeepSpeed's) "
             "named timers; dslaunch's wall-clock breakdown is wall_clock_breakdown in the "
             "config (engine.timers)"),
    _missing("deepspeed.utils.is_initialized", "not in DeepSpeed either (Transformers calls it in "
             "a dead branch); use dslaunch.comm.is_initialized"),
    # -- deepspeed.utils.groups -------------------------------------------------------------------
    _present("deepspeed.utils.groups", "dslaunch.utils.groups",
             "answers for the layout of the last dslaunch.initialize (its PipelineModule's grid "
             "or mpu): the world group for plain data parallelism, a one-rank group for an axis "
             "the job does not have"),
    *_groups("data_parallel"),
    *_groups("model_parallel"),
    *_groups("tensor_model_parallel"),
    *_groups("pipe_parallel"),
    *_groups("sequence_parallel", "the layout's sequence axis (sequence_parallel_size, or an mpu "
             "with one); without sequence parallelism: world size 1, rank 0, a group of this "
             "rank alone"),
    *_groups("sequence_data_parallel", "the sequence x data ranks (those holding the same "
             "weights); the data-parallel group's without sequence parallelism"),
    *[_present(f"deepspeed.utils.groups.{name}", f"dslaunch.engine.parallel.expert_groups:{name}",
               "per ep size, by group name `ep_size_{N}`: DeepSpeed's rank layout (E + D)")
      for name in [f"_get_expert_{kind}_{what}" for kind in ("parallel", "data_parallel")
                   for what in ("group", "world_size", "rank", "group_ranks")]],
    _present("deepspeed.utils.groups._create_expert_and_data_parallel",
             "dslaunch.engine.parallel.expert_groups:_create_expert_and_data_parallel",
             "makes the `ep_size_{N}` groups once (every rank calls it); no AutoEP+AutoTP "
             "folding_spec"),
    _present("deepspeed.utils.groups._get_max_expert_size",
             "dslaunch.engine.parallel.expert_groups:_get_max_expert_size"),
    _present("deepspeed.utils.groups._get_expert_model_parallel_world_size",
             "dslaunch.engine.parallel.expert_groups:_get_expert_model_parallel_world_size"),
    # -- deepspeed.utils.zero_to_fp32 -------------------------------------------------------------
    _present("deepspeed.utils.zero_to_fp32", "dslaunch.utils.zero_to_fp32",
             "reads dslaunch's checkpoints, both formats; `save_checkpoint` also writes a "
             "zero_to_fp32.py that needs only torch beside them"),
    _present("deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint",
             "dslaunch.engine.checkpoint.fp32_state:get_fp32_state_dict_from_zero_checkpoint"),
    _present("deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict",
             "dslaunch.engine.checkpoint.fp32_state:convert_zero_checkpoint_to_fp32_state_dict",
             "DeepSpeed's arguments in its order; a torch file or safetensors "
             "(`safe_serialization`), numbered shards + Hugging Face index json above "
             "`max_shard_size`; streams (a torch file is filled in place; at most about one fp32 "
             "copy of the model in memory otherwise); reads dslaunch checkpoints"),
    _present("deepspeed.utils.zero_to_fp32.load_state_dict_from_zero_checkpoint",
             "dslaunch.engine.checkpoint.fp32_state:load_state_dict_from_zero_checkpoint"),
    _present("deepspeed.utils.zero_to_fp32.get_model_state_file",
             "dslaunch.engine.checkpoint.state_files:get_model_state_file",
             "dslaunch's `model_states.pt` (client state at its top level, as DeepSpeed's), "
             "else DeepSpeed's file for the stage"),
    _present("deepspeed.utils.zero_to_fp32.get_optim_files",
             "dslaunch.engine.checkpoint.state_files:get_optim_files",
             "`rank_{r}_optim_states.pt` (or DeepSpeed's) in rank order; each carries "
             "`optimizer_state_dict.zero_stage` as DeepSpeed's do, not its optimizer state"),
    # -- deepspeed.checkpoint ---------------------------------------------------------------------
    _present("deepspeed.checkpoint", "dslaunch.checkpoint"),
    _present("deepspeed.checkpoint.utils", "dslaunch.checkpoint.utils"),
    _present("deepspeed.checkpoint.utils.clone_tensors_for_torch_save",
             "dslaunch.engine.storage.clone:clone_tensors_for_torch_save"),
    *[_present(f"deepspeed.checkpoint.{name}", f"dslaunch.engine.checkpoint.universal:{name}",
               "DeepSpeed's value (the universal checkpoint's keys)") for name in (
        "ORIGINAL_VOCAB_SIZE", "PADDED_VOCAB_SIZE", "UNIVERSAL_CHECKPOINT_INFO",
        "UNIVERSAL_CHECKPOINT_VERSION_KEY", "UNIVERSAL_CHECKPOINT_VERSION_VALUE",
        "PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0", "PARAMETER_WITH_ROW_PARALLELISM_PATTERNS",
        "PIPELINE_REPLICATED_PARAMETER_PATTERNS", "TP_REPLICATED_PARAMETER_PATTERNS",
        "VOCABULARY_PARAMETER_PATTERNS")],
    # -- deepspeed.runtime: the modules scripts import by their runtime path --------------------
    _present("deepspeed.runtime", "dslaunch.runtime",
             "faces for the runtime modules real code imports, not a mirror of the package"),
    _present("deepspeed.runtime.engine", "dslaunch.runtime.engine"),
    _present("deepspeed.runtime.engine.DeepSpeedEngine", "dslaunch.engine.core.engine:DSLaunchEngine",
             "the same class as deepspeed.DeepSpeedEngine"),
    _present("deepspeed.runtime.pipe", "dslaunch.runtime.pipe"),
    _present("deepspeed.runtime.pipe.PipelineModule",
             "dslaunch.engine.parallel.pipe.module:PipelineModule"),
    _present("deepspeed.runtime.pipe.LayerSpec", "dslaunch.engine.parallel.pipe.module:LayerSpec"),
    _present("deepspeed.runtime.pipe.TiedLayerSpec", "dslaunch.engine.parallel.pipe.module:TiedLayerSpec"),
    _present("deepspeed.runtime.pipe.ProcessTopology", "dslaunch.engine.parallel.topology:ProcessTopology"),
    _present("deepspeed.runtime.pipe.engine", "dslaunch.runtime.pipe.engine"),
    _present("deepspeed.runtime.pipe.engine.PipelineEngine",
             "dslaunch.engine.core.pipe_engine:PipelineEngine",
             "its instruction table is _INSTRUCTIONS over the ops of engine/parallel/pipe/schedule.py; "
             "DeepSpeed's _INSTRUCTION_MAP (which Megatron-DeepSpeed patches) does not exist"),
    _missing("deepspeed.runtime.pipe.schedule", "not provided: dslaunch's pipeline schedules "
             "(1F1B, GPipe) are instruction lists (engine/parallel/pipe/schedule.py), not DeepSpeed's "
             "PipeSchedule classes"),
    _missing("deepspeed.runtime.pipe.topology", "use deepspeed.pipe's topologies "
             "(dslaunch.pipe.PipeModelDataParallelTopology, ...): the same classes"),
    _present("deepspeed.runtime.lr_schedules", "dslaunch.runtime.lr_schedules"),
    _present("deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES",
             "dslaunch.engine.optim.schedules:VALID_LR_SCHEDULES"),
    _present("deepspeed.runtime.lr_schedules.WarmupLR",
             "dslaunch.engine.optim.schedules:WarmupLR"),
    _present("deepspeed.runtime.lr_schedules.WarmupDecayLR",
             "dslaunch.engine.optim.schedules:WarmupDecayLR"),
    _present("deepspeed.runtime.lr_schedules.WarmupCosineLR",
             "dslaunch.engine.optim.schedules:WarmupCosineLR"),
    _present("deepspeed.runtime.lr_schedules.OneCycle",
             "dslaunch.engine.optim.schedules:OneCycle"),
    _present("deepspeed.runtime.lr_schedules.LRRangeTest",
             "dslaunch.engine.optim.schedules:LRRangeTest"),
    _present("deepspeed.runtime.zero", "dslaunch.runtime.zero"),
    _present("deepspeed.runtime.zero.GatheredParameters",
             "dslaunch.engine.zero.zero_init:GatheredParameters"),
    _present("deepspeed.runtime.zero.Init", "dslaunch.engine.zero.zero_init:Init"),
    _present("deepspeed.runtime.zero.partition_parameters",
             "dslaunch.runtime.zero.partition_parameters",
             "the names below only (with the module globals Transformers patches)"),
    _present("deepspeed.runtime.zero.partition_parameters.ZeroParamStatus",
             "dslaunch.engine.zero.param_status:ZeroParamStatus",
             "ds_status of stage-3 and zero.Init parameters, kept true as they are gathered and "
             "released"),
    _present("deepspeed.runtime.zero.partition_parameters.Init",
             "dslaunch.engine.zero.zero_init:Init"),
    _present("deepspeed.runtime.zero.partition_parameters.GatheredParameters",
             "dslaunch.engine.zero.zero_init:GatheredParameters"),
    _present("deepspeed.runtime.zero.partition_parameters.zero_wrapper_for_fp_tensor_constructor",
             "dslaunch.engine.zero.init_hooks:zero_wrapper_for_fp_tensor_constructor",
             "DeepSpeed's meaning; Transformers patches it around zero.Init, whose tensor "
             "constructors dslaunch leaves alone, so the patch is harmless and changes nothing"),
    _present("deepspeed.runtime.zero.partition_parameters._orig_torch_arange",
             "dslaunch.engine.zero.init_hooks:_orig_torch_arange", "torch.arange"),
    _present("deepspeed.runtime.zero.partition_parameters.get_accelerator",
             "dslaunch.accelerator.real_accelerator:get_accelerator"),
    _present("deepspeed.runtime.zero.offload_config", "dslaunch.runtime.zero.offload_config"),
    _present("deepspeed.runtime.zero.offload_config.OffloadDeviceEnum",
             "dslaunch.config.enums:OffloadDeviceEnum"),
    _present("deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum",
             "dslaunch.config.enums:OffloadStateTypeEnum",
             "the kinds engine.offload_states(include=...) moves (engine/zero/offload_states.py); "
             "on a host without an accelerator the states are in host memory already and stay"),
    _present("deepspeed.runtime.utils", "dslaunch.runtime.utils"),
    _present("deepspeed.runtime.utils.see_memory_usage",
             "dslaunch.engine.base.runtime_utils:see_memory_usage",
             "prints on global rank 0 with force=True; on the CPU the figures are RSS"),
    _present("deepspeed.runtime.utils.set_random_seed",
             "dslaunch.engine.base.runtime_utils:set_random_seed"),
    _present("deepspeed.runtime.utils.move_to_device",
             "dslaunch.engine.base.runtime_utils:move_to_device",
             "returns moved copies (containers rebuilt); criterion_func optional"),
    _present("deepspeed.runtime.dataloader", "dslaunch.runtime.dataloader"),
    _present("deepspeed.runtime.dataloader.RepeatingLoader",
             "dslaunch.engine.base.dataloader:RepeatingLoader",
             "the same class as deepspeed.utils.RepeatingLoader"),
    _present("deepspeed.runtime.base_optimizer", "dslaunch.runtime.base_optimizer"),
    _present("deepspeed.runtime.base_optimizer.DeepSpeedOptimizer",
             "dslaunch.engine.core.deepspeed_surface:DeepSpeedOptimizer",
             "not a wrapper: initialize returns the torch optimizer itself (with overflow / "
             "cur_scale / loss_scale attributes); isinstance is true for an optimizer an engine "
             "trains with"),
    _present("deepspeed.runtime.activation_checkpointing",
             "dslaunch.runtime.activation_checkpointing"),
    _present("deepspeed.runtime.activation_checkpointing.checkpointing", "dslaunch.checkpointing",
             "the same module as deepspeed.checkpointing"),
    _present("deepspeed.runtime.sequence_parallel", "dslaunch.runtime.sequence_parallel"),
    _present("deepspeed.runtime.sequence_parallel.ulysses_sp",
             "dslaunch.runtime.sequence_parallel.ulysses_sp"),
    _present("deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF",
             "dslaunch.engine.parallel.sequence.hf:UlyssesSPAttentionHF",
             "register_with_transformers returns dslaunch's sequence x data grid as the mpu; "
             "attention masks are dropped, flex attention's BlockMask is not rebuilt"),
    _present("deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPDataLoaderAdapter",
             "dslaunch.engine.parallel.sequence.sharding:UlyssesSPDataLoaderAdapter"),
    _present("deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP",
             "dslaunch.engine.parallel.sequence.tiled:TiledMLP"),
    _present("deepspeed.runtime.sequence_parallel.ulysses_sp.TiledFusedLogitsLoss",
             "dslaunch.engine.parallel.sequence.tiled:TiledFusedLogitsLoss"),
    _present("deepspeed.runtime.data_pipeline", "dslaunch.runtime.data_pipeline",
             "the curriculum scheduler, data sampling and data routing (random-LTD)"),
    _present("deepspeed.runtime.data_pipeline.curriculum_scheduler",
             "dslaunch.runtime.data_pipeline.curriculum_scheduler"),
    _present("deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler",
             "dslaunch.engine.features.curriculum:CurriculumScheduler",
             "also drives the legacy curriculum_learning section (DeepSpeed 0.19 removed it)"),
    _present("deepspeed.runtime.data_pipeline.config", "dslaunch.runtime.data_pipeline.config",
             "get_data_efficiency_config and the section getters; bad keys raise naming them"),
    _present("deepspeed.runtime.data_pipeline.constants",
             "dslaunch.runtime.data_pipeline.constants"),
    _present("deepspeed.runtime.data_pipeline.data_sampling",
             "dslaunch.runtime.data_pipeline.data_sampling",
             "curriculum data sampling: the offline analyzer, the sampler, .bin/.idx files"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.data_analyzer",
             "dslaunch.runtime.data_pipeline.data_sampling.data_analyzer"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.data_analyzer.DataAnalyzer",
             "dslaunch.runtime.data_pipeline.data_sampling.data_analyzer:DataAnalyzer",
             "the same files as DeepSpeed's, byte for byte (benchmarks/"
             "compare_data_sampling_ds.py); the reduce runs in one process"),
    _missing("deepspeed.runtime.data_pipeline.data_sampling.data_analyzer."
             "DistributedDataAnalyzer",
             "not provided: run DataAnalyzer.run_map() in each worker (worker_id, num_workers) "
             "and run_reduce() in one; the files are the same"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.data_sampler",
             "dslaunch.runtime.data_pipeline.data_sampling.data_sampler"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.data_sampler.DeepSpeedDataSampler",
             "dslaunch.runtime.data_pipeline.data_sampling.data_sampler:DeepSpeedDataSampler",
             "serves DeepSpeed's indices for the same config, seed and index files; each rank "
             "computes the batch (no broadcast) and the state also holds its generator"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset",
             "dslaunch.runtime.data_pipeline.data_sampling.indexed_dataset",
             "the mmap .bin/.idx format only (not the lazy/cached ones)"),
    *[_present(f"deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset.{name}",
               f"dslaunch.runtime.data_pipeline.data_sampling.indexed_dataset:{name}")
      for name in ("MMapIndexedDataset", "MMapIndexedDatasetBuilder", "make_builder",
                   "make_dataset")],
    _present("deepspeed.runtime.data_pipeline.data_sampling.utils",
             "dslaunch.runtime.data_pipeline.data_sampling.utils"),
    _present("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr",
             "dslaunch.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr",
             "dynamic batching: a library the script calls, as in DeepSpeed (the engine does "
             "not read dynamic_batching); same micro-batches and LRs (benchmarks/"
             "compare_dynamic_batching_ds.py)"),
    *[_present("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr."
               f"{name}",
               f"dslaunch.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr:{name}")
      for name in ("batch_by_seqlens", "scale_lr", "dataloader_for_variable_batch_size",
                   "VariableBatchSizeLR", "lr_scheduler_for_variable_batch_size",
                   "get_dataloader_and_lr_scheduler_for_variable_batch_size",
                   "get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed")],
    _present("deepspeed.runtime.data_pipeline.data_routing",
             "dslaunch.runtime.data_pipeline.data_routing",
             "random layer-wise token dropping (random-LTD); runs on any device in torch ops"),
    _present("deepspeed.runtime.data_pipeline.data_routing.basic_layer",
             "dslaunch.runtime.data_pipeline.data_routing.basic_layer"),
    _present("deepspeed.runtime.data_pipeline.data_routing.basic_layer.RandomLayerTokenDrop",
             "dslaunch.engine.features.random_ltd.layer:RandomLayerTokenDrop",
             "also passes positional arguments after the hidden states to the layer, and finds "
             "the mask among them by the layer's signature (Transformers 5's GPT2Block passes "
             "it positionally; DeepSpeed reads only the keyword)"),
    _present("deepspeed.runtime.data_pipeline.data_routing.helper",
             "dslaunch.runtime.data_pipeline.data_routing.helper"),
    _present("deepspeed.runtime.data_pipeline.data_routing.helper.convert_to_random_ltd",
             "dslaunch.engine.features.random_ltd.convert:convert_to_random_ltd",
             "also on the bare model before initialize; a layer drops tokens when its own index "
             "(the last number of its name) is in random_ltd_layer_id (DeepSpeed: the id's "
             "digits anywhere in the name)"),
    *[_present(f"deepspeed.runtime.data_pipeline.data_routing.helper.{name}",
               f"dslaunch.engine.features.random_ltd.convert:{name}")
      for name in ("save_without_random_ltd", "remove_random_ltd_state_dict")],
    _present("deepspeed.runtime.data_pipeline.data_routing.scheduler",
             "dslaunch.runtime.data_pipeline.data_routing.scheduler"),
    _present("deepspeed.runtime.data_pipeline.data_routing.scheduler.RandomLTDScheduler",
             "dslaunch.engine.features.random_ltd.scheduler:RandomLTDScheduler",
             "DeepSpeed 0.19.8's values and state_dict; the engine builds it from the config "
             "(engine.random_ltd_scheduler)"),
    _present("deepspeed.runtime.data_pipeline.data_routing.scheduler.BaseScheduler",
             "dslaunch.engine.features.random_ltd.scheduler:RandomLTDScheduler",
             "the same class as RandomLTDScheduler"),
    _present("deepspeed.runtime.data_pipeline.data_routing.utils",
             "dslaunch.runtime.data_pipeline.data_routing.utils"),
    _present("deepspeed.runtime.config", "dslaunch.runtime.config"),
    _present("deepspeed.runtime.config.DeepSpeedConfig", "dslaunch.runtime.config:DeepSpeedConfig",
             "resolved by dslaunch's config room for this job's data-parallel size; DeepSpeed's "
             "most-read attributes (batch triad, zero_config, fp16/bf16, optimizer and scheduler "
             "names and params, monitor_config, ...) and typed (every section)"),
    _present("deepspeed.runtime.progressive_layer_drop",
             "dslaunch.runtime.progressive_layer_drop",
             "DeepSpeed 0.19 removed it; dslaunch keeps the progressive_layer_drop section"),
    _present("deepspeed.runtime.progressive_layer_drop.ProgressiveLayerDrop",
             "dslaunch.engine.features.progressive_layer_drop:ProgressiveLayerDrop"),
    _present("deepspeed.runtime.eigenvalue", "dslaunch.runtime.eigenvalue",
             "DeepSpeed 0.19.8 no longer has it (0.18.9 does); dslaunch keeps the eigenvalue "
             "section, top level (DeepSpeed read quantize_training.eigenvalue and refused it "
             "since 0.7)"),
    _present("deepspeed.runtime.eigenvalue.Eigenvalue", "dslaunch.engine.features.eigenvalue:Eigenvalue",
             "DeepSpeed 0.18's semantics and result; compute_eigenvalue also takes grads= "
             "(gradients with graph), block_eigenvalues() gives the raw values"),
    # -- subsystems of other issues -----------------------------------------------------------------
    # -- deepspeed.checkpointing ----------------------------------------------------------------
    _present("deepspeed.checkpointing", "dslaunch.checkpointing",
             "saved inputs are autograd saved tensors (saved_tensors_hooks see them); "
             "contiguous_checkpointing is accepted and keeps no buffers; cpu_checkpointing "
             "changes nothing on a CPU-only host"),
    *[_present(f"deepspeed.checkpointing.{name}", f"dslaunch.engine.features.activation_checkpoint:{name}",
               why) for name, why in (
        ("configure", "deepspeed_config= is a dict or a file path"),
        ("checkpoint", "reentrant, as DeepSpeed's; random and autocast state replayed"),
        ("is_configured", ""), ("reset", ""),
        ("get_cuda_rng_tracker", "the accelerator's generator (the CPU's on a CPU host)"),
        ("model_parallel_cuda_manual_seed", "tensor-parallel rank from the configured mpu, "
         "else dslaunch.utils.groups"),
        ("model_parallel_reconfigure_tp_seed", ""))],
    _present("deepspeed.sequence", "dslaunch.sequence"),
    _present("deepspeed.sequence.layer", "dslaunch.sequence.layer"),
    _present("deepspeed.sequence.layer.DistributedAttention",
             "dslaunch.engine.parallel.sequence.ulysses:DistributedAttention",
             "sp_stream (overlap on a side CUDA stream) is accepted and not used; head counts "
             "the sequence-parallel size does not divide are refused (DeepSpeed splits unevenly)"),
    _present("deepspeed.profiling", "dslaunch.profiling"),
    _present("deepspeed.profiling.flops_profiler", "dslaunch.profiling.flops_profiler",
             "counts at the ATen level: every functional, matmul, einsum and "
             "scaled_dot_product_attention, not a list of patched functions"),
    _present("deepspeed.profiling.flops_profiler.profiler",
             "dslaunch.profiling.flops_profiler.profiler"),
    _present("deepspeed.profiling.flops_profiler.FlopsProfiler",
             "dslaunch.engine.observe.profiling.flops_profiler:FlopsProfiler",
             "forward counts only, as DeepSpeed; the engine's flops_profiler section times "
             "forward, backward and step of the profiled step"),
    _present("deepspeed.profiling.flops_profiler.get_model_profile",
             "dslaunch.engine.observe.profiling.flops_profiler:get_model_profile"),
    _present("deepspeed.moe", "dslaunch.moe"),
    _present("deepspeed.moe.layer", "dslaunch.moe.layer"),
    _present("deepspeed.moe.layer.MoE", "dslaunch.engine.parallel.moe.layer:MoE",
             "DeepSpeed 0.19's signature and routing; use_tutel runs dslaunch's dispatch; no "
             "expert tensor parallelism"),
    _present("deepspeed.moe.experts", "dslaunch.moe.experts"),
    _present("deepspeed.moe.experts.Experts", "dslaunch.engine.parallel.moe.experts:Experts"),
    _present("deepspeed.moe.sharded_moe", "dslaunch.moe.sharded_moe"),
    _present("deepspeed.moe.sharded_moe.TopKGate", "dslaunch.engine.parallel.moe.gating:TopKGate"),
    _present("deepspeed.moe.sharded_moe.MOELayer", "dslaunch.engine.parallel.moe.layer:MOELayer"),
    _present("deepspeed.moe.utils", "dslaunch.moe.utils"),
    _present("deepspeed.moe.utils.has_moe_layers", "dslaunch.engine.parallel.moe.layer:has_moe_layers"),
    *[_present(f"deepspeed.moe.utils.{name}", f"dslaunch.engine.parallel.moe.params:{name}")
      for name in ("is_moe_param", "split_params_into_different_moe_groups_for_optimizer",
                   "split_params_into_shared_and_expert_params",
                   "split_params_grads_into_shared_and_expert_params", "is_moe_param_group",
                   "configure_moe_param_groups")],
    _missing("deepspeed.module_inject", AUTOTP),
    _missing("deepspeed.inference", INFERENCE),
    _present("deepspeed.compression", "dslaunch.compression",
             "DeepSpeed 0.19 removed it (0.18.9 has it): weight and activation quantization, "
             "sparse, row and head pruning of nn.Linear, channel pruning of nn.Conv2d, layer "
             "reduction; snip_momentum, fp16_mixed_quantize, quantization and sparse pruning of "
             "Conv2d / Embedding, and tensor-parallel layers (mpu=) are refused or not applied"),
    _present("deepspeed.compression.compress", "dslaunch.compression.compress"),
    *[_present(f"deepspeed.compression.compress.{name}",
               f"dslaunch.engine.features.compression.compress:{name}", why) for name, why in (
        ("init_compression", "teacher_model: layer_reduction's teacher"),
        ("redundancy_clean", "also sets out_features/in_features of the shrunk related modules"),
        ("get_module_name", ""))],
    _present("deepspeed.compression.init_compression",
             "dslaunch.engine.features.compression.compress:init_compression"),
    _present("deepspeed.compression.redundancy_clean",
             "dslaunch.engine.features.compression.compress:redundancy_clean"),
    _present("deepspeed.compression.compression_scheduler",
             "dslaunch.engine.features.compression.scheduler:compression_scheduler",
             "also steps weight quantization's bits (start_bits -> target_bits, MoQ's schedule)"),
    _present("deepspeed.compression.scheduler", "dslaunch.compression.scheduler"),
    _present("deepspeed.compression.scheduler.compression_scheduler",
             "dslaunch.engine.features.compression.scheduler:compression_scheduler"),
    _present("deepspeed.compression.basic_layer", "dslaunch.compression.basic_layer"),
    _present("deepspeed.compression.basic_layer.Conv2dLayer_Compress",
             "dslaunch.engine.features.compression.conv:Conv2dLayer_Compress", "channel pruning only"),
    _present("deepspeed.compression.basic_layer.BNLayer_Compress",
             "dslaunch.engine.features.compression.conv:BNLayer_Compress"),
    _present("deepspeed.compression.basic_layer.LinearLayer_Compress",
             "dslaunch.engine.features.compression.layers:LinearLayer_Compress",
             "head pruning also takes method l1 (each head's column block's L1 norm)"),
    _missing("deepspeed.launcher.runner", "the launcher is the `dslaunch run` command; "
             "`python -m dslaunch` takes a `deepspeed` command line as typed (its flags, "
             "`.deepspeed_env`; docs/launcher.md)"),
    # -- deepspeed.monitor ------------------------------------------------------------------------
    _present("deepspeed.monitor", "dslaunch.monitor",
             "the monitors the engine writes with (csv_monitor, tensorboard, wandb, comet "
             "sections), under DeepSpeed's class names and constructors"),
    _present("deepspeed.monitor.monitor", "dslaunch.monitor.monitor"),
    _present("deepspeed.monitor.monitor.Monitor", "dslaunch.monitor.monitor:Monitor"),
    _present("deepspeed.monitor.monitor.MonitorMaster", "dslaunch.monitor.monitor:MonitorMaster",
             "MonitorMaster(get_monitor_config(config_dict)); rank 0 writes, as DeepSpeed's"),
    _present("deepspeed.monitor.config", "dslaunch.monitor.config"),
    _present("deepspeed.monitor.config.get_monitor_config",
             "dslaunch.monitor.config:get_monitor_config",
             "the config dict's csv_monitor, tensorboard, wandb and comet sections, checked as "
             "dslaunch.initialize checks them"),
    _present("deepspeed.monitor.config.DeepSpeedMonitorConfig",
             "dslaunch.monitor.config:DeepSpeedMonitorConfig",
             "built by get_monitor_config (not a pydantic model)"),
    *[_present(f"deepspeed.monitor.{module}", f"dslaunch.monitor.{module}") for module in (
        "csv_monitor", "tensorboard", "wandb", "comet")],
    *[_present(f"deepspeed.monitor.{module}.{name}", f"dslaunch.monitor.monitor:{name}", why)
      for module, name, why in (
        ("csv_monitor", "csvMonitor", "one CSV file per event under output_path/job_name"),
        ("tensorboard", "TensorBoardMonitor", "needs the tensorboard package"),
        ("wandb", "WandbMonitor", "needs the wandb package"),
        ("comet", "CometMonitor", "needs the comet_ml package"))],
    _missing("deepspeed.monitor.utils", "DeepSpeed's package checks for the monitors; a monitor "
             "whose package is missing says so when it is made"),
    # -- deepspeed.elasticity ----------------------------------------------------------------------
    _present("deepspeed.elasticity", "dslaunch.elasticity",
             "the solver of the config's elasticity section (the one dslaunch.initialize uses); "
             "DeepSpeed 0.19.8's wheel no longer ships this package, earlier releases do and "
             "scripts (ms-swift) import it"),
    _present("deepspeed.elasticity.compute_elastic_config",
             "dslaunch.elasticity.elasticity:compute_elastic_config",
             "DeepSpeed's arguments and return values; target_deepspeed_version is accepted and "
             "not compared (the solver is dslaunch's, versions 0.1 and 0.2)"),
    _present("deepspeed.elasticity.elasticity_enabled",
             "dslaunch.elasticity.elasticity:elasticity_enabled"),
    _present("deepspeed.elasticity.ensure_immutable_elastic_config",
             "dslaunch.elasticity.elasticity:ensure_immutable_elastic_config",
             "compares with the DEEPSPEED_ELASTICITY_CONFIG variable the launcher exports, "
             "as DeepSpeed's"),
    _present("deepspeed.elasticity.config", "dslaunch.elasticity.config"),
    *[_present(f"deepspeed.elasticity.config.{name}", f"dslaunch.elasticity.config:{name}")
      for name in ("ElasticityError", "ElasticityConfigError", "ElasticityIncompatibleWorldSize")],
    _missing("deepspeed.elasticity.elastic_agent", "not provided: DeepSpeed's torchelastic agent; "
             "`dslaunch run --min_elastic_nodes N --max_elastic_nodes M` restarts the job on the hosts "
             "that remain (docs/launcher.md)"),
    # -- modules `import deepspeed` loads as its own machinery (deepspeed_imports.py) ----------
    *_all_missing("deepspeed.accelerator", "abstract_accelerator cpu_accelerator",
                  "DeepSpeed's accelerator classes; dslaunch's are dslaunch.accelerator.Accelerator "
                  "and its CPU and CUDA subclasses (get_accelerator() returns one)"),
    _missing("deepspeed.autotuning", "DeepSpeed's autotuner classes are not provided; the "
             "autotuner is the `dslaunch autotune` command"),
    *_all_missing("deepspeed.checkpoint", "affine autoep_affine autoep_zero3_metadata constants "
                  "deepspeed_checkpoint ds_to_universal reshape_3d_utils reshape_meg_2d "
                  "reshape_utils universal_checkpoint zero_checkpoint", UCP),
    *_all_missing("deepspeed.comm", "backend ccl comm config constants pg_utils reduce_op torch "
                  "utils", COMM_INTERNAL),
    _missing("deepspeed.compile", "not planned yet: DeepSpeed's DeepCompile graph passes"),
    _missing("deepspeed.constants", "not provided: DeepSpeed's launcher constants (default "
             "ports, timeouts); dslaunch's launcher has its own (docs/launcher.md)"),
    _missing("deepspeed.datastates", "not planned: DeepSpeed's DataStates asynchronous "
             "checkpoint engine"),
    *_all_missing("deepspeed", "git_version_info git_version_info_installed",
                  "not provided: DeepSpeed's build record; use deepspeed.__version__"),
    _missing("deepspeed.io", "not provided: DeepSpeed's FastFileWriter (torch.save through "
             "DeepNVMe); move tensors to files with AsyncIOBuilder().load().aio_handle() "
             "(deepspeed.ops.op_builder)"),
    _missing("deepspeed.linear", "not planned yet: DeepSpeed's OptimizedLinear (LoRA, quantized "
             "base weights)"),
    _missing("deepspeed.model_implementations", INFERENCE),
    _missing("deepspeed.moe.mappings", "not provided: DeepSpeed's gather/drop helpers for expert "
             "tensor parallelism, which dslaunch's MoE does not have"),
    *_all_missing("deepspeed.ops.adam", "cpu_adam fused_adam multi_tensor_apply", OPS_FILES),
    *_all_missing("deepspeed.ops.adam", "zenflow_cpu_adam zenflow_torch_adam", ZENFLOW),
    _missing("deepspeed.ops.adagrad.cpu_adagrad", OPS_FILES),
    _missing("deepspeed.ops.lamb.fused_lamb", OPS_FILES),
    *_all_missing("deepspeed.ops.lion", "cpu_lion fused_lion multi_tensor_apply", OPS_FILES),
    _missing("deepspeed.ops.fp_quantizer", "not planned: DeepSpeed's FP8/FP6 quantization kernels"),
    *_all_missing("deepspeed.profiling", "config constants",
                  "DeepSpeed's parsing of the flops_profiler config section; the engine reads the "
                  "section itself (deepspeed.profiling.flops_profiler is provided)"),
    *_all_missing("deepspeed.runtime.activation_checkpointing", "config offload_activations",
                  ENGINE_INTERNAL),
    *_all_missing("deepspeed.runtime", "bf16_optimizer checkpoint_engine comm compiler "
                  "config_utils constants fp16 keep_in_fp32 model_checkpointing precision_config "
                  "sparse_tensor state_dict_factory swap_tensor torch_autocast weight_quantizer",
                  ENGINE_INTERNAL),
    *_all_missing("deepspeed.runtime", "hybrid_engine hybrid_engine_graph",
                  "not planned: DeepSpeed-Chat's hybrid engine (inference kernels inside RLHF "
                  "training); " + INFERENCE),
    _missing("deepspeed.runtime.tensor_parallel", AUTOTP),
    _missing("deepspeed.runtime.zenflow", ZENFLOW),
    _missing("deepspeed.runtime.pipe.module", "use deepspeed.pipe's (or deepspeed.runtime.pipe's) "
             "PipelineModule, LayerSpec and TiedLayerSpec: the same classes"),
    *_all_missing("deepspeed.runtime.pipe", "p2p dualpipev", ENGINE_INTERNAL),
    _missing("deepspeed.runtime.zero.muon", "DeepSpeed's Muon internals; write "
             "\"optimizer\": {\"type\": \"Muon\"} in the config (dslaunch.engine.optim.muon: "
             "DeepSpeed's parameter split and keys, ZeRO 0-3 and CPU offload; docs/muon.md)"),
    *_all_missing("deepspeed.runtime.zero", "config leaf_module_config linear offload_states "
                  "parameter_offload partitioned_param_coordinator partitioned_param_profiler "
                  "stage3 stage_1_and_2 tiling utils", ZERO_INTERNAL),
    *_all_missing("deepspeed.utils", "bwc comms_logging config debug exceptions init_on_device "
                  "mixed_precision_linkage module_utils numa nvtx pin_memory_tracker "
                  "tensor_fragment torch types", UTILS_INTERNAL),
]

BY_NAME = {n.deepspeed: n for n in NAMES}


def row(deepspeed_name: str) -> Optional[Name]:
    """The row of a DeepSpeed name, or of the nearest module above it that has one."""
    name = deepspeed_name
    while name:
        if name in BY_NAME:
            return BY_NAME[name]
        name = name.rpartition(".")[0]
    return None


def resolve(name: Name):
    """The object a present row points at (imports its module)."""
    module, _, attr = name.ours.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _why(deepspeed_name: str) -> str:
    found = row(deepspeed_name)
    if found is not None and not found.present:
        return found.why
    return "not provided by dslaunch yet; see docs/porting.md for the supported names"


def missing_attribute(module_name: str, attr: str) -> AttributeError:
    """The error a face raises for a DeepSpeed name it does not provide (``module_name`` is the
    face's dslaunch module, e.g. ``dslaunch.zero``)."""
    deepspeed_name = "deepspeed" + module_name[len("dslaunch"):] + "." + attr
    return AttributeError(f"module {module_name!r} has no attribute {attr!r}: DeepSpeed's "
                          f"{deepspeed_name} {_why(deepspeed_name)}")


def face_getattr(module_name: str):
    """A PEP 562 ``__getattr__`` for the face package ``module_name``: ``dslaunch.X.<name>`` is
    what ``deepspeed.X.<name>`` is after a plain ``import deepspeed`` (DeepSpeed imports its
    submodules eagerly, scripts reach them as attributes): a module the table names, imported on
    first use (so ``import dslaunch`` stays cheap); a missing row's name fails with its reason."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        found = BY_NAME.get("deepspeed" + module_name[len("dslaunch"):] + "." + name)
        if found is not None and found.present and ":" not in found.ours:
            return resolve(found)
        raise missing_attribute(module_name, name)

    return __getattr__


def porting_table() -> str:
    """The Markdown table of docs/porting.md: one line per row, and one line for a run of
    missing rows that share their reason (the modules DeepSpeed loads as its own machinery)."""
    lines = ["| DeepSpeed name | dslaunch | status |", "|---|---|---|"]
    runs: list[list[Name]] = []
    for n in NAMES:
        if runs and not n.present and not runs[-1][0].present and runs[-1][0].why == n.why:
            runs[-1].append(n)
        else:
            runs.append([n])
    for run in runs:
        n = run[0]
        status = ("yes" + (f": {n.why}" if n.why else "")) if n.present else f"no: {n.why}"
        ours = f"`{n.dslaunch_name}`" if len(run) == 1 else "—"
        lines.append(f"| {', '.join(f'`{m.deepspeed}`' for m in run)} | {ours} | {status} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- names:begin -->", "<!-- names:end -->"


def render_porting(page: str) -> str:
    """``page`` (docs/porting.md) with the table between its markers regenerated."""
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{porting_table()}{END}{tail}"


if __name__ == "__main__":  # python -m dslaunch.deepspeed_names [docs/porting.md]: regenerate
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as f:
            text = render_porting(f.read())
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(porting_table())
