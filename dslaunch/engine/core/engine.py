"""The training engine: orchestration only (forward, backward, step, counters, logging).

Everything with an idea of its own lives elsewhere: gradients, reduction, clipping and the
optimizer step in the ZeRO strategy (``zero/``), precision and loss scaling in ``precision.py``,
optimizers and schedules in ``optim/``, collectives in ``comm.py``, monitors and timers in
``monitor.py``, checkpoint files in ``checkpoint/``, DeepSpeed's accessors and switches
(``config``, ``no_sync``, ``destroy``, ...) in ``deepspeed_surface.py``.
"""

from __future__ import annotations

import contextlib
import time

import torch

from dslaunch import progress_record
from dslaunch.config import to_dict
from dslaunch.engine.base import fault_injection
from dslaunch.engine.base.autocast import Autocast
from dslaunch.engine.base.precision import build_precision
from dslaunch.engine.checkpoint import save_load as ckpt
from dslaunch.engine.comm.api import record_comm
from dslaunch.engine.core import config_accessors
from dslaunch.engine.core.deepspeed_surface import DeepSpeedSurface
from dslaunch.engine.core.direct_backward import DirectBackward
from dslaunch.engine.core.recovery_seams import NoRecovery
from dslaunch.engine.features.curriculum import CurriculumScheduler
from dslaunch.engine.features.data_sampling import DataSamplingSurface, curriculum_dataloader, uses_curriculum_sampling
from dslaunch.engine.features.eigenvalue_hook import EigenvalueAtBoundaries
from dslaunch.engine.features.progressive_layer_drop import ProgressiveLayerDrop
from dslaunch.engine.features.random_ltd.engine_surface import RandomLTDSurface
from dslaunch.engine.observe.autotuning_meter import TrialMeter
from dslaunch.engine.observe.flops import EngineFlops
from dslaunch.engine.observe.monitor import Monitors, WallClock
from dslaunch.engine.optim import build_optimizer
from dslaunch.engine.optim.schedules import build_scheduler
from dslaunch.engine.parallel import experts
from dslaunch.engine.zero import build_optimizer_strategy


def _compression_scheduler(model, section):
    """The compression scheduler when the section switches a method on, else None."""
    if not section or not any(((section.get(m) or {}).get("shared_parameters") or {}).get("enabled")
                              for m in section if m != "layer_reduction"):
        return None
    from dslaunch.engine.features.compression import compression_scheduler  # only jobs that compress import it

    return compression_scheduler(model, section)


class DSLaunchEngine(RandomLTDSurface, DataSamplingSurface, DeepSpeedSurface, torch.nn.Module):
    """What ``dslaunch.initialize`` returns: call it like the model, then ``backward(loss)`` and
    ``step()`` on every micro-batch (DeepSpeed's contract), or ``step()`` only at the boundaries
    that ``set_gradient_accumulation_boundary`` marks (Accelerate's)."""

    _shuffle_training_data = True  # training_data= is served shuffled (DeepSpeed's engine)
    pipeline_parallelism = False  # DeepSpeed's engine attribute: True on the pipeline engine

    def __init__(self, args, model, optimizer, model_parameters, training_data, lr_scheduler,
                 collate_fn, cfg, comm, data_parallel=None, recovery=None):
        super().__init__()
        # in-process recovery's seams (initialize hands them in: recovery/inprocess.py); off: each
        # call runs as it is
        self._recovery = recovery if recovery is not None else NoRecovery()
        self.args = args
        self.module = model
        self._config = cfg  # the typed, frozen config (dslaunch.config.sections), resolved once
        self.config = to_dict(cfg)  # DeepSpeed's engine.config: a dict (frameworks .get() it)
        self.comm = comm
        record_comm(comm)  # the script's dslaunch.comm calls on this group book here too
        if cfg.comms_logger.enabled:  # DeepSpeed's engine switches its comms logger on here
            from dslaunch.engine.observe.comms_logger import configure as configure_comms_logger

            configure_comms_logger(cfg)
        self.global_rank = comm.rank
        self.world_size = comm.world_size
        # (size, rank) of the data-parallel axis when the gradient group is wider (sequence
        # parallelism: comm is the sequence x data plane; the batch counts data ranks only)
        self.dp_world_size, self._dp_rank = data_parallel or (comm.world_size, None)
        from dslaunch.engine.comm.collectives import local_rank

        self.local_rank = local_rank()
        from dslaunch.accelerator import get_accelerator

        self.device = torch.device(get_accelerator().current_device_name())
        model.to(self.device)

        self._micro_batch = cfg.train_micro_batch_size_per_gpu
        self._gas = cfg.gradient_accumulation_steps
        self._train_batch = cfg.train_batch_size
        self._clip = cfg.gradient_clipping  # engine.gradient_clipping() is DeepSpeed's accessor
        self._print_every = cfg.steps_per_print  # engine.steps_per_print(): the accessor
        self.precision = build_precision(cfg.fp16, cfg.bf16)
        # torch_autocast: forward in the autocast dtype, the safe modules' gradients reduced in
        # it (marked before the strategy lays out its buckets)
        self.autocast = Autocast(cfg.torch_autocast, self.device.type)
        self.autocast.mark(model)

        # MoE: the layers make their expert groups first (DeepSpeed's engine does the same)
        experts.set_up_parallelism(model)
        self.has_moe_layers = experts.has_experts(model)
        if self.has_moe_layers:
            experts.refuse_stage3(model, cfg.zero_optimization.stage)

        # optimizer: user object, user factory, the config's, or none (forward only)
        client_optimizer = optimizer is not None
        if optimizer is None and cfg.optimizer is not None:
            params = model_parameters if model_parameters is not None else model.parameters()
            optimizer = build_optimizer(params, cfg.optimizer, model=model)
        elif callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(model_parameters if model_parameters is not None
                                  else model.parameters())
        client_optimizer_name = type(optimizer).__name__ if client_optimizer else None
        if self.has_moe_layers and optimizer is not None:
            # expert and dense parameters are reduced (and partitioned) over different groups
            experts.split_optimizer_groups(optimizer)
        self.expert_groups = experts.ExpertGroups(model, comm)  # (checkpoint names of experts)
        self.expert_groups.book_into(comm)  # the layers' all-to-alls in comm_stats()
        self.zero_stage = cfg.zero_optimization.stage
        # an autotuning trial's config: measure, write the metric, exit (None otherwise)
        self._autotune = TrialMeter.from_config(cfg, model, self.device)
        self.strategy = build_optimizer_strategy(model, optimizer, cfg, comm, self.precision)
        self.optimizer = self.strategy.optimizer
        self._trains = self.optimizer is not None  # False: forward only
        if self.zero_stage == 3 and hasattr(self.strategy, "_module_hooks"):
            from dslaunch.engine.zero.param_offload import ZeroParamOffload

            offload = ZeroParamOffload(self.strategy, model)
            if self._trains:  # DeepSpeed's stage-3 optimizer carries it
                self.optimizer.parameter_offload = offload
            else:  # and without an optimizer, it is the engine's optimizer (TRL relies on both)
                self.optimizer = offload

        if not self._trains:  # DeepSpeed ignores a config scheduler without an optimizer
            if lr_scheduler is not None:
                raise ValueError("dslaunch.initialize: lr_scheduler= needs an optimizer "
                                 "(optimizer= or an \"optimizer\" section in the config)")
        elif lr_scheduler is None and cfg.scheduler is not None:
            lr_scheduler = build_scheduler(cfg.scheduler, self.optimizer)
        elif callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            lr_scheduler = lr_scheduler(self.optimizer)
        self.lr_scheduler = lr_scheduler

        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data, collate_fn=collate_fn,
                                                         shuffle=self._shuffle_training_data)

        self.global_steps = 0
        self._faults = fault_injection.RankFaults.from_env()  # dslaunch run --inject; else None
        self._progress = progress_record.writer()  # the hang watchdog's step counter (or None)
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self.monitors = Monitors(cfg, self.global_rank)
        self.timers = WallClock(cfg.wall_clock_breakdown)
        self._losses: list = []
        self._tokens = 0
        self._last_print = (time.perf_counter(), 0, 0)  # (time, tokens, forwards) at the last print
        self._flops = EngineFlops(self, cfg.flops_profiler)  # the profiled step; MFU
        self._allreduce_seconds = 0.0
        self._async_saver = None  # checkpoint/async_save.py, made by the first save
        self._direct_backward = DirectBackward(self)  # loss.backward() without engine.backward
        self.curriculum_scheduler_legacy = None  # the legacy curriculum_learning section
        if cfg.curriculum_learning.enabled:
            self.curriculum_scheduler_legacy = CurriculumScheduler(
                to_dict(cfg.curriculum_learning))
        pld = cfg.progressive_layer_drop
        self.progressive_layer_drop = ProgressiveLayerDrop(pld.theta, pld.gamma) \
            if pld.enabled else None
        # the eigenvalue section: DeepSpeed's engine.eigenvalue and engine.block_eigenvalue
        self._eigenvalues = EigenvalueAtBoundaries.from_config(cfg.eigenvalue, model, self.device)
        self.eigenvalue = self._eigenvalues.eigenvalue if self._eigenvalues else None
        self.block_eigenvalue = None
        # compression_training: the scheduler switches on what init_compression set up
        self.compression_scheduler = _compression_scheduler(model, cfg.compression_training)
        self._init_surface(client_optimizer_name)
        self._init_random_ltd()  # data_efficiency.data_routing.random_ltd (random_ltd/)

    # -- measurements ----------------------------------------------------------------------------
    def memory_breakdown(self) -> dict:
        return self.strategy.memory_breakdown()

    def comm_stats(self) -> dict:
        return self.comm.stats()

    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True, *,
                     route=None, pin_memory=False, data_sampler=None, num_local_io_workers=None):
        """A loader of this data-parallel rank's share of ``dataset``. DeepSpeed's keywords
        ``data_sampler`` (used as it is, e.g. dynamic batching's ``deepspeed_io_kwargs``),
        ``pin_memory`` and ``num_local_io_workers`` are taken; ``route`` is accepted."""
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        if uses_curriculum_sampling(self):  # data_efficiency.data_sampling (data_sampling.py)
            return curriculum_dataloader(self, dataset, batch_size, collate_fn)
        sampler = data_sampler
        if sampler is None:
            rank = self.global_rank if self._dp_rank is None else self._dp_rank
            sampler = DistributedSampler(dataset, num_replicas=self.dp_world_size, rank=rank,
                                         shuffle=shuffle)
        return DataLoader(dataset, batch_size=batch_size or self._micro_batch, sampler=sampler,
                          collate_fn=collate_fn, pin_memory=pin_memory,
                          num_workers=num_local_io_workers or 0)

    # -- the loop ------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._states.check_loaded("forward()")
        self._recovery.forward_starts()
        self.timers.start("forward")
        self.tput_timer.start()
        args = self.precision.cast_inputs(args)
        kwargs = self.precision.cast_inputs(kwargs)
        tokens = 0
        if args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
            tokens = args[0].numel()
            self._tokens += tokens  # token ids: counted for tokens/s
        self._flops.forward_begin(tokens)
        if self.progressive_layer_drop is not None and self.module.training:
            kwargs.update(self.progressive_layer_drop.get_state())  # the model drops its layers
        if self.curriculum_scheduler_legacy is not None and self.module.training:
            difficulty = self.curriculum_scheduler_legacy.update_difficulty(self.global_steps + 1)
            if self._config.curriculum_learning.curriculum_type == "seqlen":
                kwargs["curriculum_seqlen"] = difficulty  # the model cuts its sequences
        self._random_ltd_forward()  # the kept length of this step (random-LTD layers read it)
        sched = self.compression_scheduler
        if sched is not None and (self.global_steps == 0 or sched.training_steps != self.global_steps):
            # offset-0 methods on before the first step; after a checkpoint load, the schedule
            # resumes at the engine's step
            sched.training_steps = self.global_steps
            sched.step(step_zero_check=True)
        with self.autocast.region(), (self._eigenvalues.forward_region() if self._eigenvalues
                                      else contextlib.nullcontext()):
            out = self._recovery.forward(self, lambda: self.module(*args, **kwargs))
        self._flops.forward_end()
        if self._trains and torch.is_grad_enabled():
            self._direct_backward.attach(out)
        self.timers.stop("forward")
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Backward of ``loss * loss_scale / gradient_accumulation_steps`` (with
        ``scale_wrt_gas=False`` the caller divided by the accumulation steps itself, as
        Transformers' Trainer does); at a boundary the strategy then reduces the gradients over
        the data-parallel ranks."""
        return self._recovery.backward(self, self._backward, loss, retain_graph, scale_wrt_gas)

    def _backward(self, loss, retain_graph, scale_wrt_gas):
        self.timers.start("backward")
        boundary = self._reduces_gradients()
        self._unmanaged_backwards += 1
        self._losses.append(loss.detach().float())
        scale = self.precision.scaler.loss_scale / (self._gas if scale_wrt_gas else 1)
        scaled = loss.float() * scale if scale != 1.0 else loss
        self.strategy.prepare_backward(boundary)
        self._direct_backward.inside_engine_backward = True
        self._flops.phase_begin()
        try:
            # eigenvalue: this window's gradients with graph, taken first (eigenvalue_hook.py)
            keep = self._eigenvalues is not None and self._eigenvalues.capture(scaled)
            scaled.backward(retain_graph=retain_graph or keep)
        finally:
            self._direct_backward.inside_engine_backward = False
        before = self._reduce_seconds()
        self.strategy.after_backward(boundary)
        self._flops.phase_end("bwd")
        self.timers.stop("backward")
        self.timers.add("allreduce", (self._reduce_seconds() - before) * 1e3)
        return loss

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the loss scale (fp16; 1 otherwise), for a caller that runs
        ``.backward()`` itself (DeepSpeed's): the engine's forward divided by the accumulation
        steps already, and the gradients are reduced when that backward ends."""
        self._check_can_train("scale()")
        self._losses.append(loss.detach().float())
        self._direct_backward.scaled()
        scale = self.precision.scaler.loss_scale
        return loss.float() * scale if scale != 1.0 else loss

    def _reduce_seconds(self) -> float:
        rec = self.comm._stats.get("all_reduce") or self.comm._stats.get("reduce_scatter")
        return rec["seconds"] if rec else 0.0

    def step(self, lr_kwargs=None):
        """Optimizer step at an accumulation boundary; in between only counts the micro-step."""
        return self._recovery.step(self, self._step_call, lr_kwargs)

    def _step_call(self, lr_kwargs):
        self._check_step_allowed()
        if not self._managed_accumulation:  # the caller's boundary: reduce what backward kept
            self._inside_step = True
            self.strategy.finish_accumulation()
        try:
            self._step(lr_kwargs)
        finally:
            self._inside_step = False
        if self._async_saver is not None:  # a background save that finished: record it
            self._async_saver.poll()

    def _step(self, lr_kwargs):
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            self.timers.start("step")
            if self._eigenvalues is not None and self._eigenvalues.count_boundary():
                self.block_eigenvalue = self._eigenvalues.compute(self.loss_scale)
            if self.progressive_layer_drop is not None:  # before the step, as DeepSpeed's order
                self.progressive_layer_drop.update_state(self.global_steps)
            self._flops.phase_begin()
            applied = self.strategy.step(self._clip, self.precision.scaler)
            self.strategy.zero_grad()
            self._flops.phase_end("step")
            self._record_step(applied)
            if applied:
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            else:
                self.skipped_steps += 1
            self.global_steps += 1
            if self.compression_scheduler is not None:  # after the step, as DeepSpeed's
                self.compression_scheduler.step()
            if self._progress is not None:  # also what the live job view shows (launcher/jobview.py)
                self._progress.step(self.global_steps, self._tokens, self._device_memory())
            if self._managed_accumulation:
                self.global_samples += self._train_batch
            else:  # the micro-batches this step really saw (DeepSpeed counts the same)
                self.global_samples += (self._micro_batch * self.dp_world_size
                                        * self._unmanaged_backwards)
            self._unmanaged_backwards = 0
            self.timers.stop("step")
            self._flops.step_done()
            self._after_step(applied)
            if self._faults is not None:
                self._faults.at_step(self.global_steps)
            if self._autotune is not None:
                self._autotune.after_step(self)
        self.tput_timer.stop(global_step=boundary)
        self.micro_steps += 1

    def zero_grad(self):
        self.strategy.zero_grad()

    def _abandon_step(self) -> None:
        """In-process recovery: drop the interrupted step (gradients, losses, micro-steps); the
        next forward starts the same step again (engine/recovery/)."""
        self.strategy.abandon()  # gradients (ZeRO 1-2: and collectives in flight)
        self._losses.clear()
        self._unmanaged_backwards = 0
        self.micro_steps = self.global_steps * self._gas

    def _device_memory(self) -> int:
        """Bytes allocated on this rank's GPU now (-1 on a CPU): the allocator's own count, no sync."""
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else -1

    def _after_step(self, applied: bool) -> None:
        # no loss is known when the script ran loss.backward() itself (direct_backward.py)
        loss = torch.stack(self._losses).mean().item() if self._losses else None
        self._losses.clear()
        lr = self.get_lr()[0] if self.optimizer.param_groups else 0.0
        if self.monitors.enabled:
            events = [("Train/Samples/lr", lr, self.global_samples)]
            if loss is not None:
                events.insert(0, ("Train/Samples/train_loss", loss, self.global_samples))
            if self.precision.name == "fp16":
                events.append(("Train/Samples/loss_scale", self.loss_scale, self.global_samples))
            if self._eigenvalues is not None:
                events += self._eigenvalues.summary_events(self.block_eigenvalue,
                                                           self.global_samples)
            self.monitors.write_events(events)
        if self._print_every and self.global_steps % self._print_every == 0:
            now = time.perf_counter()
            t0, tok0, fwd0 = self._last_print
            # every rank of the gradient group counts its own tokens (a sequence shard with SP)
            rate = (self._tokens - tok0) * self.comm.world_size / max(now - t0, 1e-9)
            forwards = self._flops.forwards
            self._last_print = (now, self._tokens, forwards)
            if self.global_rank == 0:
                msg = (f"[dslaunch] step {self.global_steps}"
                       + (f" loss {loss:.4f}" if loss is not None else "") + f" lr {lr:.4g}")
                if self.precision.name == "fp16":
                    msg += f" loss_scale {self.loss_scale:g}"
                if not applied:
                    msg += " (skipped: overflow)"
                if rate > 0:
                    msg += f" tokens/s {rate:,.0f}"
                msg += self._flops.mfu_text(self._tokens - tok0, forwards - fwd0, now - t0)
                print(msg, flush=True)
                if self.timers.enabled:
                    print(f"[dslaunch] {self.timers.report()}", flush=True)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False, async_save=None, keep_last=None):
        """DeepSpeed's; ``async_save`` / ``keep_last`` (dslaunch's, default: the config's
        ``checkpoint.async_save`` / ``checkpoint.keep_last``): write in the background
        (``wait_checkpoint()``), keep only the newest N checkpoints."""
        return self._recovery.save(self, lambda: ckpt.save_checkpoint(
            self, save_dir, tag=tag, client_state=client_state or {}, save_latest=save_latest,
            exclude_frozen_parameters=exclude_frozen_parameters, async_save=async_save,
            keep_last=keep_last))

    def wait_checkpoint(self) -> None:
        """Every rank calls it: an asynchronous save in flight is written and ``latest`` moved
        (raises if any rank failed). The next save or load waits too; so does exit (locally)."""
        ckpt.async_saver(self).wait()

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        return ckpt.save_16bit_model(self, save_dir, save_filename=save_filename,
                                     exclude_frozen_parameters=exclude_frozen_parameters)

    save_fp16_model = save_16bit_model  # DeepSpeed's older name

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        if self._recovery.holds_live_state(self):
            return None, {}
        with self._recovery.engine_call(self):
            loaded = ckpt.load_checkpoint(self, load_dir, tag=tag, strict=load_module_strict,
                                          load_optimizer_states=load_optimizer_states,
                                          load_lr_scheduler_states=load_lr_scheduler_states,
                                          load_module_only=load_module_only)
            self._publish_step_state(overflow=False)  # the loss scale may have been restored
            if getattr(self.strategy, "copies", None) is not None:  # in-process, ZeRO 1-2
                self.strategy.copies.exchange(self.strategy)
        return loaded


config_accessors.install(DSLaunchEngine)  # engine.gradient_clipping(), engine.zero_*() ...
