"""DeepSpeed's config accessors on the engine: ``engine.gradient_clipping()``,
``engine.zero_reduce_bucket_size()``, ``engine.flops_profiler_enabled()``... DeepSpeed 0.19.8's
engine has some hundred one-line methods that return a config value, and scripts call them
(``if engine.zero_optimization_partition_weights(): ...``). Each one here reads the same key of
the resolved config, so it answers what DeepSpeed's would, defaults included.

``ACCESSORS``: method name -> the config key it returns (a dotted path of the schema; a section
comes back as the typed section, None inside an absent one). ``DERIVED``: the few whose answer
is computed from keys.
``install(cls)`` adds them to the engine class; a name the class (or a base) already has is left
alone.
"""

from __future__ import annotations

_ZERO = "zero_optimization."

ACCESSORS = {
    "gradient_clipping": "gradient_clipping",
    "gradient_predivide_factor": "gradient_predivide_factor",
    "steps_per_print": "steps_per_print",
    "dump_state": "dump_state",
    "zero_allow_untested_optimizer": "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer": "zero_force_ds_cpu_optimizer",
    "communication_data_type": "communication_data_type",
    "optimizer_legacy_fusion": "optimizer.legacy_fusion",
    "optimizer_params": "optimizer.params",
    "scheduler_name": "scheduler.type",
    "scheduler_params": "scheduler.params",
    "torch_autocast_enabled": "torch_autocast.enabled",
    "torch_autocast_dtype": "torch_autocast.dtype",
    "use_node_local_storage": "checkpoint.use_node_local_storage",
    "load_universal_checkpoint": "checkpoint.load_universal",
    "autotp_size": "tensor_parallel.autotp_size",
    "tensor_parallel_config": "tensor_parallel",
    "aio_config": "aio",
    "flops_profiler_enabled": "flops_profiler.enabled",
    "flops_profiler_profile_step": "flops_profiler.profile_step",
    "flops_profiler_module_depth": "flops_profiler.module_depth",
    "flops_profiler_top_modules": "flops_profiler.top_modules",
    "flops_profiler_detailed": "flops_profiler.detailed",
    "flops_profiler_output_file": "flops_profiler.output_file",
    "flops_profiler_recompute_fwd_factor": "flops_profiler.recompute_fwd_factor",
    "autotuning_enabled": "autotuning.enabled",
    "autotuning_metric": "autotuning.metric",
    "autotuning_start_profile_step": "autotuning.start_profile_step",
    "autotuning_end_profile_step": "autotuning.end_profile_step",
    "autotuning_metric_path": "autotuning.metric_path",
    "autotuning_model_info_path": "autotuning.model_info_path",
    "fp16_auto_cast": "fp16.auto_cast",
    "fp16_master_weights_and_gradients": "fp16.fp16_master_weights_and_grads",
    "bf16_master_weights_and_gradients": "bf16.bf16_master_weights_and_grads",
    "bf16_optimizer_states": "bf16.bf16_optimizer_states",
    "zero_allgather_bucket_size": _ZERO + "allgather_bucket_size",
    "zero_allgather_partitions": _ZERO + "allgather_partitions",
    "zero_contiguous_gradients": _ZERO + "contiguous_gradients",
    "zero_elastic_checkpoint": _ZERO + "elastic_checkpoint",
    "zero_load_from_fp32_weights": _ZERO + "load_from_fp32_weights",
    "zero_reduce_bucket_size": _ZERO + "reduce_bucket_size",
    "zero_reduce_scatter": _ZERO + "reduce_scatter",
    "zero_overlap_comm": _ZERO + "overlap_comm",
    "zero_sub_group_size": _ZERO + "sub_group_size",
    "zero_round_robin_gradients": _ZERO + "round_robin_gradients",
    "zero_ignore_unused_parameters": _ZERO + "ignore_unused_parameters",
    "zero_legacy_stage1": _ZERO + "legacy_stage1",
    "zero_multi_rank_bucket_allreduce": _ZERO + "use_multi_rank_bucket_allreduce",
    "zero_parameter_alignment": _ZERO + "parameter_alignment",
    "zero_log_trace_cache_warnings": _ZERO + "log_trace_cache_warnings",
    "zero_compute_grad_norm": _ZERO + "compute_grad_norm",
    "zero_save_muon_momentum_buffer_in_memory": _ZERO + "save_muon_momentum_buffer_in_memory",
    "is_sanity_checks_enabled": _ZERO + "enable_sanity_checks",
    "zero_hpz_partition_size": _ZERO + "zero_hpz_partition_size",
    "zero_quantized_weights": _ZERO + "zero_quantized_weights",
    "zero_quantized_gradients": _ZERO + "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights": _ZERO + "zero_quantized_nontrainable_weights",
    "zero_partial_offload": _ZERO + "offload_optimizer.ratio",
    # DeepSpeed's field names for what a config file spells stage3_*
    "zero_max_live_parameters": _ZERO + "stage3_max_live_parameters",
    "zero_max_reuse_distance": _ZERO + "stage3_max_reuse_distance",
    "zero_prefetch_bucket_size": _ZERO + "stage3_prefetch_bucket_size",
    "zero_param_persistence_threshold": _ZERO + "stage3_param_persistence_threshold",
    "zero_model_persistence_threshold": _ZERO + "stage3_model_persistence_threshold",
    "zero_module_granularity_threshold": _ZERO + "stage3_module_granularity_threshold",
    "zero_allgather_sequential": _ZERO + "stage3_allgather_sequential",
}


def _offload(section: str):
    """DeepSpeed's answer is None when the section is off, else the section."""
    def get(engine):
        sub = _read(engine, _ZERO + section)
        return None if str(sub.device) == "none" else sub
    return get


DERIVED = {
    "postscale_gradients": lambda e: not _read(e, "prescale_gradients"),
    "dynamic_loss_scale": lambda e: _read(e, "fp16.loss_scale") == 0,
    "zero_offload_optimizer": _offload("offload_optimizer"),
    "zero_offload_param": _offload("offload_param"),
    "zero_cpu_offload": lambda e: str(_read(e, _ZERO + "offload_optimizer.device")) == "cpu",
    "zero_optimization_partition_gradients": lambda e: e.zero_optimization_stage() >= 2,
    "zero_optimization_partition_weights": lambda e: e.zero_optimization_stage() >= 3,
}


def _read(engine, path: str):
    """The typed config's value at ``path``; None inside an absent section (no ``optimizer`` or
    ``scheduler``: DeepSpeed answers None too)."""
    value = engine._config
    for part in path.split("."):
        if value is None:
            return None
        value = getattr(value, part)
    return value


def _method(name: str, get):
    def accessor(self):
        return get(self)
    accessor.__name__ = accessor.__qualname__ = name
    accessor.__doc__ = f"DeepSpeed's ``engine.{name}()``: the resolved config's answer."
    return accessor


def install(cls) -> None:
    for name, path in ACCESSORS.items():
        if not hasattr(cls, name):
            setattr(cls, name, _method(name, lambda e, path=path: _read(e, path)))
    for name, get in DERIVED.items():
        if not hasattr(cls, name):
            setattr(cls, name, _method(name, get))
