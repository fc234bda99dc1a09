"""The DeepSpeed modules that a plain ``import deepspeed`` loads, as measured: scripts reach them
as attributes (``deepspeed.moe.layer.MoE(...)`` after only ``import deepspeed``), so after
``import dslaunch`` (and under the ``--as-deepspeed`` alias) each one is either reachable the same
way (its row in ``deepspeed_names.py`` is present: the face package hands it out lazily, PEP 562)
or is a missing row there whose reason says what to use instead. ``tests/test_deepspeed_imports.py``
checks every name.

Measured with DeepSpeed 0.19.8 (torch 2.13.0+cpu, Python 3.11, CPU accelerator) in the peer
venv (``python benchmarks/peers.py`` makes it):

    benchmarks/.peer-venv/bin/python -c "import sys, deepspeed; print('\\n'.join(sorted(
        m for m in sys.modules if m.startswith('deepspeed.') and sys.modules[m] is not None)))"

then, for each, whether ``getattr`` down from ``deepspeed`` gives that module (``NOT_THE_MODULE``
lists the four where DeepSpeed's attribute is something else: a function or a re-export).
Plain data: importing this module imports nothing.
"""

MEASURED_WITH = "0.19.8"

# deepspeed.<name> for each module in sys.modules after `import deepspeed`
IMPORTED = tuple("""
    accelerator accelerator.abstract_accelerator accelerator.cpu_accelerator
    accelerator.real_accelerator autotuning autotuning.autotuner autotuning.config
    autotuning.constants autotuning.scheduler autotuning.tuner autotuning.tuner.base_tuner
    autotuning.tuner.cost_model autotuning.tuner.index_based_tuner
    autotuning.tuner.model_based_tuner autotuning.tuner.utils autotuning.utils checkpoint
    checkpoint.affine checkpoint.autoep_affine checkpoint.autoep_zero3_metadata
    checkpoint.constants checkpoint.deepspeed_checkpoint checkpoint.ds_to_universal
    checkpoint.reshape_3d_utils checkpoint.reshape_meg_2d checkpoint.reshape_utils
    checkpoint.universal_checkpoint checkpoint.utils checkpoint.zero_checkpoint comm
    comm.backend comm.ccl comm.comm comm.config comm.constants comm.pg_utils comm.reduce_op
    comm.torch comm.utils compile compile.config compile.constants compile.fx
    compile.graph_param compile.list_schedule compile.passes compile.passes.contract
    compile.passes.offload_activation compile.passes.offload_adam_states
    compile.passes.offload_parameters compile.passes.prefetch compile.passes.selective_gather
    compile.passes.zero3_compile compile.passes.zero_1_and_2_compile compile.profilers
    compile.profilers.comm_profile compile.profilers.graph_profile compile.util
    compile.z3_eager_fallback constants datastates datastates.config git_version_info
    git_version_info_installed inference inference.config inference.engine
    inference.quantization inference.quantization.utils io io.base_file_writer io.base_io_buffer
    io.constants io.double_io_buffer io.fast_file_writer io.mock_file_writer io.py_file_writer
    io.single_io_buffer io.utils linear linear.config linear.context_manager
    linear.optimized_linear linear.quantization model_implementations
    model_implementations.diffusers model_implementations.diffusers.unet
    model_implementations.diffusers.vae model_implementations.features
    model_implementations.features.cuda_graph model_implementations.transformers
    model_implementations.transformers.clip_encoder model_implementations.transformers.ds_bert
    model_implementations.transformers.ds_bloom model_implementations.transformers.ds_gpt
    model_implementations.transformers.ds_llama2
    model_implementations.transformers.ds_megatron_gpt model_implementations.transformers.ds_opt
    model_implementations.transformers.ds_transformer module_inject
    module_inject.auto_ep_folding module_inject.auto_tp module_inject.auto_tp_model_utils
    module_inject.autotp_config module_inject.containers module_inject.containers.base
    module_inject.containers.base_moe module_inject.containers.bert
    module_inject.containers.bloom module_inject.containers.clip
    module_inject.containers.distil_bert module_inject.containers.features
    module_inject.containers.features.gated_mlp module_inject.containers.features.hybrid_engine
    module_inject.containers.features.hybrid_megatron module_inject.containers.features.megatron
    module_inject.containers.features.meta_tensor module_inject.containers.features.split_qkv
    module_inject.containers.gpt2 module_inject.containers.gptj module_inject.containers.gptneo
    module_inject.containers.gptneox module_inject.containers.internlm
    module_inject.containers.llama module_inject.containers.llama2
    module_inject.containers.megatron_gpt module_inject.containers.megatron_gpt_moe
    module_inject.containers.opt module_inject.containers.unet module_inject.containers.vae
    module_inject.fusedqkv_utils module_inject.layers module_inject.load_checkpoint
    module_inject.module_quantize module_inject.policy module_inject.replace_module
    module_inject.replace_policy module_inject.tp_shard module_inject.utils moe moe.experts
    moe.layer moe.mappings moe.sharded_moe moe.utils monitor monitor.comet monitor.config
    monitor.csv_monitor monitor.monitor monitor.tensorboard monitor.utils monitor.wandb ops
    ops.adagrad ops.adagrad.cpu_adagrad ops.adam ops.adam.cpu_adam ops.adam.fused_adam
    ops.adam.multi_tensor_apply ops.adam.zenflow_cpu_adam ops.adam.zenflow_torch_adam
    ops.fp_quantizer ops.fp_quantizer.fp8_gemm ops.fp_quantizer.quantize ops.lamb
    ops.lamb.fused_lamb ops.lion ops.lion.cpu_lion ops.lion.fused_lion
    ops.lion.multi_tensor_apply ops.op_builder ops.op_builder.async_io ops.op_builder.builder
    ops.op_builder.cpu ops.op_builder.cpu.async_io ops.op_builder.cpu.builder
    ops.op_builder.cpu.comm ops.op_builder.cpu.cpu_adagrad ops.op_builder.cpu.cpu_adam
    ops.op_builder.cpu.cpu_lion ops.op_builder.cpu.fused_adam ops.op_builder.cpu.no_impl
    ops.op_builder.cpu.pin_memory ops.op_builder.dc ops.op_builder.evoformer_attn
    ops.op_builder.fp_quantizer ops.op_builder.fused_adam ops.op_builder.fused_lamb
    ops.op_builder.fused_lion ops.op_builder.gds ops.op_builder.hpu ops.op_builder.hpu.builder
    ops.op_builder.hpu.cpu_adam ops.op_builder.hpu.fused_adam ops.op_builder.hpu.no_impl
    ops.op_builder.hpu.transformer_inference ops.op_builder.inference_core_ops
    ops.op_builder.inference_cutlass_builder ops.op_builder.klxpu ops.op_builder.klxpu.async_io
    ops.op_builder.klxpu.builder ops.op_builder.klxpu.cpu_adagrad ops.op_builder.klxpu.cpu_adam
    ops.op_builder.klxpu.cpu_lion ops.op_builder.klxpu.fused_adam ops.op_builder.klxpu.no_impl
    ops.op_builder.klxpu.pin_memory ops.op_builder.klxpu.utils ops.op_builder.mlu
    ops.op_builder.mlu.builder ops.op_builder.mlu.cpu_adagrad ops.op_builder.mlu.cpu_adam
    ops.op_builder.mlu.fused_adam ops.op_builder.mlu.no_impl ops.op_builder.mps
    ops.op_builder.mps.builder ops.op_builder.mps.cpu_adam ops.op_builder.mps.fused_adam
    ops.op_builder.mps.no_impl ops.op_builder.npu ops.op_builder.npu.async_io
    ops.op_builder.npu.builder ops.op_builder.npu.cpu_adagrad ops.op_builder.npu.cpu_adam
    ops.op_builder.npu.cpu_lion ops.op_builder.npu.fused_adam ops.op_builder.npu.fused_lamb
    ops.op_builder.npu.fused_lion ops.op_builder.npu.inference ops.op_builder.npu.no_impl
    ops.op_builder.npu.pin_memory ops.op_builder.npu.quantizer ops.op_builder.pin_memory
    ops.op_builder.pin_memory_load ops.op_builder.quantizer ops.op_builder.ragged_ops
    ops.op_builder.ragged_utils ops.op_builder.random_ltd ops.op_builder.sdaa
    ops.op_builder.sdaa.builder ops.op_builder.sdaa.cpu_adam ops.op_builder.sdaa.fused_adam
    ops.op_builder.sdaa.no_impl ops.op_builder.spatial_inference
    ops.op_builder.stochastic_transformer ops.op_builder.supa ops.op_builder.supa.async_io
    ops.op_builder.supa.builder ops.op_builder.supa.cpu_adagrad ops.op_builder.supa.cpu_adam
    ops.op_builder.supa.cpu_lion ops.op_builder.supa.fused_adam ops.op_builder.supa.fused_lamb
    ops.op_builder.supa.fused_lion ops.op_builder.supa.inference ops.op_builder.supa.no_impl
    ops.op_builder.supa.pin_memory ops.op_builder.supa.quantizer ops.op_builder.transformer
    ops.op_builder.transformer_inference ops.op_builder.utils ops.op_builder.xpu
    ops.op_builder.xpu.async_io ops.op_builder.xpu.builder ops.op_builder.xpu.cpu_adagrad
    ops.op_builder.xpu.cpu_adam ops.op_builder.xpu.flash_attn ops.op_builder.xpu.fused_adam
    ops.op_builder.xpu.no_impl ops.op_builder.xpu.pin_memory ops.random_ltd
    ops.random_ltd.dropping_utils ops.transformer ops.transformer.inference
    ops.transformer.inference.bias_add ops.transformer.inference.config
    ops.transformer.inference.diffusers_2d_transformer
    ops.transformer.inference.diffusers_attention
    ops.transformer.inference.diffusers_transformer_block ops.transformer.inference.ds_attention
    ops.transformer.inference.ds_mlp ops.transformer.inference.moe_inference
    ops.transformer.inference.op_binding ops.transformer.inference.op_binding.base
    ops.transformer.inference.op_binding.bias_residual
    ops.transformer.inference.op_binding.einsum_sec_sm_ecm
    ops.transformer.inference.op_binding.gated_activation
    ops.transformer.inference.op_binding.gelu_gemm
    ops.transformer.inference.op_binding.layer_norm ops.transformer.inference.op_binding.linear
    ops.transformer.inference.op_binding.mlp_gemm
    ops.transformer.inference.op_binding.moe_res_matmul
    ops.transformer.inference.op_binding.pad_transform
    ops.transformer.inference.op_binding.pre_rms_norm
    ops.transformer.inference.op_binding.qkv_gemm
    ops.transformer.inference.op_binding.residual_add
    ops.transformer.inference.op_binding.rms_norm ops.transformer.inference.op_binding.softmax
    ops.transformer.inference.op_binding.softmax_context
    ops.transformer.inference.op_binding.vector_add
    ops.transformer.inference.op_binding.vector_matmul
    ops.transformer.inference.op_binding.workspace ops.transformer.transformer pipe profiling
    profiling.config profiling.constants profiling.flops_profiler
    profiling.flops_profiler.profiler runtime runtime.activation_checkpointing
    runtime.activation_checkpointing.checkpointing runtime.activation_checkpointing.config
    runtime.activation_checkpointing.offload_activations runtime.base_optimizer
    runtime.bf16_optimizer runtime.checkpoint_engine runtime.checkpoint_engine.checkpoint_engine
    runtime.checkpoint_engine.datastates_checkpoint_engine
    runtime.checkpoint_engine.decoupled_checkpoint_engine
    runtime.checkpoint_engine.fast_checkpoint_engine
    runtime.checkpoint_engine.torch_checkpoint_engine runtime.checkpoint_engine.utils
    runtime.comm runtime.comm.coalesced_collectives runtime.compiler runtime.config
    runtime.config_utils runtime.constants runtime.data_pipeline runtime.data_pipeline.config
    runtime.data_pipeline.constants runtime.data_pipeline.curriculum_scheduler
    runtime.data_pipeline.data_routing runtime.data_pipeline.data_routing.basic_layer
    runtime.data_pipeline.data_routing.helper runtime.data_pipeline.data_routing.scheduler
    runtime.data_pipeline.data_sampling runtime.data_pipeline.data_sampling.data_sampler
    runtime.data_pipeline.data_sampling.indexed_dataset
    runtime.data_pipeline.data_sampling.utils runtime.dataloader runtime.engine runtime.fp16
    runtime.fp16.fused_optimizer runtime.fp16.loss_scaler runtime.fp16.unfused_optimizer
    runtime.hybrid_engine runtime.hybrid_engine_graph runtime.keep_in_fp32 runtime.lr_schedules
    runtime.model_checkpointing runtime.model_checkpointing.config
    runtime.model_checkpointing.constants
    runtime.model_checkpointing.data_parallel_writer_factory runtime.model_checkpointing.utils
    runtime.model_checkpointing.writer_factory runtime.pipe runtime.pipe.dualpipev
    runtime.pipe.engine runtime.pipe.module runtime.pipe.p2p runtime.pipe.schedule
    runtime.pipe.topology runtime.precision_config runtime.sparse_tensor
    runtime.state_dict_factory runtime.swap_tensor runtime.swap_tensor.aio_config
    runtime.swap_tensor.async_swapper runtime.swap_tensor.constants
    runtime.swap_tensor.optimizer_utils runtime.swap_tensor.partitioned_optimizer_swapper
    runtime.swap_tensor.partitioned_param_swapper
    runtime.swap_tensor.pipelined_optimizer_swapper runtime.swap_tensor.utils
    runtime.tensor_parallel runtime.tensor_parallel.config runtime.tensor_parallel.init_utils
    runtime.tensor_parallel.tp_manager runtime.torch_autocast runtime.utils
    runtime.weight_quantizer runtime.zenflow runtime.zenflow.engine
    runtime.zenflow.engine_stage3 runtime.zenflow.zenflow_config
    runtime.zenflow.zenflow_stage_1_and_2 runtime.zenflow.zenflow_utils runtime.zero
    runtime.zero.config runtime.zero.leaf_module_config runtime.zero.linear
    runtime.zero.offload_config runtime.zero.offload_states runtime.zero.parameter_offload
    runtime.zero.partition_parameters runtime.zero.partitioned_param_coordinator
    runtime.zero.partitioned_param_profiler runtime.zero.stage3 runtime.zero.stage_1_and_2
    runtime.zero.tiling runtime.zero.utils utils utils.bwc utils.comms_logging utils.config
    utils.debug utils.exceptions utils.groups utils.init_on_device utils.logging
    utils.mixed_precision_linkage utils.module_utils utils.numa utils.nvtx
    utils.pin_memory_tracker utils.tensor_fragment utils.timer utils.torch utils.types
    utils.z3_leaf_module utils.zero_to_fp32
""".split())

# DeepSpeed's attribute of this name is not the module (a same-named function or re-export wins)
NOT_THE_MODULE = frozenset({'comm.torch', 'comm.utils', 'utils.tensor_fragment', 'utils.z3_leaf_module'})
