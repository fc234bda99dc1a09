"""DeepSpeed's engine members besides the training loop: the accessors, switches and private
helpers that frameworks call on the object ``initialize`` returns (Transformers, Accelerate,
Lightning, TRL, the RLHF stacks). ``DSLaunchEngine`` inherits ``DeepSpeedSurface``; forward,
backward and step stay in ``engine.py``.

Semantics are DeepSpeed's where frameworks depend on them:

- ``config`` is the resolved config as a dict (``engine.config.get("zero_optimization")``); the
  typed one is ``engine._config``;
- ``is_gradient_accumulation_boundary()`` counts micro-steps, unless
  ``set_gradient_accumulation_boundary(b)`` said otherwise (Accelerate sets it before every
  backward and calls ``step()`` only at boundaries; counting callers call ``step()`` every time);
  with ``managed_gradient_accumulation: false`` the caller owns the boundary: backward only
  accumulates, every ``step()`` reduces (where the stage has not already) and steps, and the
  boundary is true only while ``step()`` runs;
- ``no_sync()`` (ZeRO 0-1 only): backward inside it reduces nothing; a backward at a boundary
  or a ``step()`` inside it is refused (a step must see reduced gradients);
- the optimizer ``initialize`` returns carries ``overflow``, ``cur_scale`` and ``loss_scale``,
  refreshed at every step (Accelerate reads ``optimizer.overflow`` to know a step was skipped);
- unknown attributes are looked up on the wrapped module (DeepSpeed-Chat calls
  ``engine.gradient_checkpointing_enable()``).
"""

from __future__ import annotations

import contextlib

import torch

from dslaunch.config.enums import OffloadDeviceEnum
from dslaunch.engine.observe.monitor import ThroughputTimer
from dslaunch.engine.parallel import groups as parallel_groups
from dslaunch.engine.zero.no_optimizer import NoOptimizerError
from dslaunch.engine.zero.offload_states import StateOffloader

# config optimizer names DeepSpeed reports in lower case (its own optimizers)
_DEEPSPEED_OPTIMIZERS = {"adagrad", "adam", "adamw", "lamb", "onebitadam", "zerooneadam",
                         "onebitlamb", "lion", "muadam", "muadamw", "musgd", "muon"}


class EngineDestroyedError(RuntimeError):
    """The engine was used after ``destroy()``."""


class _Destroyed:
    """Stands in for the strategy after ``destroy()``: any use says so."""

    def __getattr__(self, name):
        raise EngineDestroyedError(f"engine.destroy() was called: this engine cannot be used "
                                   f"any more (asked for strategy.{name})")


def _refuse_after_destroy(module, args):
    raise EngineDestroyedError("engine.destroy() was called: this engine cannot run forward")


_MANAGED = "_dslaunch_engine_optimizer"  # set on the optimizer an engine trains with


class _ManagedOptimizerType(type):
    def __instancecheck__(cls, obj) -> bool:
        return getattr(obj, _MANAGED, False) is True or type.__instancecheck__(cls, obj)


class DeepSpeedOptimizer(metaclass=_ManagedOptimizerType):
    """``deepspeed.runtime.base_optimizer.DeepSpeedOptimizer``. DeepSpeed's ZeRO optimizers
    derive from it, and frameworks tell "an optimizer the engine owns" apart with ``isinstance``
    (Lightning Fabric decides by it whether a checkpoint load restores optimizer states). The
    engine here trains with the torch optimizer itself, so ``isinstance(opt, DeepSpeedOptimizer)``
    is true for an optimizer some engine trains with (marked when the engine takes it)."""


def _set_unless_property(obj, name: str, value) -> None:
    """Plain attribute on ``obj``, unless its class defines ``name`` itself (a property of a
    DeepSpeed-style optimizer keeps its own meaning)."""
    if not isinstance(getattr(type(obj), name, None), property):
        setattr(obj, name, value)


class DeepSpeedSurface:
    """Mixed into ``DSLaunchEngine`` (an ``nn.Module``): reads the engine's ``_config``,
    ``precision``, ``strategy``, ``optimizer``, ``comm``, ``module`` and counters."""

    def _init_surface(self, client_optimizer_name) -> None:
        """After the optimizer and scheduler are set up; ``client_optimizer_name``: the class
        name of the optimizer the caller passed (object or factory), None otherwise."""
        self._client_optimizer_name = client_optimizer_name
        self._states = StateOffloader(self)  # offload_states() / reload_states()
        if self._trains:
            setattr(self.optimizer, _MANAGED, True)  # isinstance(opt, DeepSpeedOptimizer)
        if self._trains:  # OpenRLHF calls them on engine.optimizer, as DeepSpeed's ZeRO has them
            for name in ("offload_states", "reload_states"):
                if not hasattr(self.optimizer, name):
                    setattr(self.optimizer, name, getattr(self, name))
        self._boundary_override = None  # set_gradient_accumulation_boundary's answer
        # managed_gradient_accumulation false: the caller owns the boundary, every step() is one
        self._managed_accumulation = self._config.managed_gradient_accumulation is not False
        self._inside_step = False
        self._unmanaged_backwards = 0  # backward() calls since the last step() (global_samples)
        self._inside_no_sync = False
        self._step_applied = False
        self.tput_timer = ThroughputTimer(self._train_batch)
        self._publish_step_state(overflow=False)

    # -- batch and accumulation ----------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self._train_batch

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._micro_batch

    def gradient_accumulation_steps(self) -> int:
        return self._gas

    def is_gradient_accumulation_boundary(self) -> bool:
        if not self._managed_accumulation:  # the caller's step() is the boundary
            return self._inside_step
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self._gas == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """From now on, this decides whether a backward ends an accumulation window (and a
        ``step()`` steps), instead of counting micro-steps."""
        if not self._managed_accumulation:
            raise AssertionError(
                "set_gradient_accumulation_boundary() cannot be used with "
                "managed_gradient_accumulation: false (every step() is the boundary there); "
                "remove the call or the config key")
        self._boundary_override = bool(is_boundary)

    def managed_gradient_accumulation(self) -> bool:
        return self._managed_accumulation

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """A new global batch: the micro-batch stays, the accumulation steps follow."""
        per_step = self._micro_batch * self.dp_world_size
        if train_batch_size <= 0 or train_batch_size % per_step:
            raise ValueError(f"set_train_batch_size({train_batch_size}): not a multiple of "
                             f"micro-batch {self._micro_batch} x data-parallel size "
                             f"{self.dp_world_size}")
        self._set_batch(self._micro_batch, train_batch_size // per_step)

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """A new micro-batch: the accumulation steps stay, the global batch follows (DeepSpeed's
        rule). A data loader the engine built keeps its batch size, as in DeepSpeed."""
        if micro_batch_size <= 0:
            raise ValueError(f"set_train_micro_batch_size({micro_batch_size}): must be >= 1")
        self._set_batch(int(micro_batch_size), self._gas)

    def _set_batch(self, micro: int, gas: int) -> None:
        """The batch triad from a micro-batch and accumulation steps, in the engine, its config
        dict and the throughput timer."""
        self._micro_batch, self._gas = micro, gas
        self._train_batch = micro * gas * self.dp_world_size
        self.config.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas,
                           train_batch_size=self._train_batch)
        self.tput_timer.batch_size = self._train_batch

    def _check_can_train(self, what: str) -> None:
        self._states.check_loaded(what)
        if not self._trains:
            raise NoOptimizerError(
                f"engine.{what}: this engine was built without an optimizer (no optimizer= and "
                "no \"optimizer\" section in the config), so it runs forward only (evaluation, "
                "a frozen reference model); pass an optimizer to dslaunch.initialize to train")

    def _reduces_gradients(self) -> bool:
        """Whether the backward about to run ends an accumulation window (the strategy then
        reduces the gradients); inside ``no_sync()`` none may."""
        self._check_can_train("backward()")
        boundary = self.is_gradient_accumulation_boundary()
        if boundary and self._inside_no_sync:
            raise AssertionError(
                "engine.backward() inside no_sync() at a gradient accumulation boundary: the "
                "boundary's backward must reduce the gradients; run it outside no_sync() (or "
                "mark it with set_gradient_accumulation_boundary(False))")
        return boundary

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside it reduces no gradients (DDP's ``no_sync``); ZeRO 0 and 1 only, as in
        DeepSpeed (stages 2 and 3 reduce gradient partitions at every backward)."""
        if self.zero_optimization_stage() >= 2:
            raise AssertionError(f"no_sync() is incompatible with the gradient partitioning of "
                                 f"ZeRO stage {self.zero_optimization_stage()}")
        if self._inside_no_sync:
            raise AssertionError("no_sync() cannot be re-entered")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def _check_step_allowed(self) -> None:
        self._check_can_train("step()")
        if self._inside_no_sync:
            raise AssertionError("engine.step() inside no_sync(): gradients are not reduced "
                                 "there; step after leaving it")

    # -- after a step --------------------------------------------------------------------------
    def _record_step(self, applied: bool) -> None:
        self._step_applied = applied
        self._publish_step_state(overflow=not applied)

    def _publish_step_state(self, overflow: bool) -> None:
        """DeepSpeed's optimizers carry the overflow flag and the loss scale: so does ours."""
        if not self._trains:
            return
        scale = self.precision.scaler.loss_scale
        for name, value in (("overflow", overflow), ("cur_scale", scale), ("loss_scale", scale)):
            _set_unless_property(self.optimizer, name, value)

    def was_step_applied(self) -> bool:
        """False when the last optimizer step was skipped (fp16 overflow) or none ran yet."""
        return self._step_applied

    def get_lr(self) -> list:
        return [g["lr"] for g in self.optimizer.param_groups] if self._trains else []

    def set_custom_curriculum_learning_schedule(self, schedule_func) -> None:
        """``schedule_type: custom``: the difficulty as a function of the step. Data sampling
        (data_efficiency) takes a dict ``{metric: fn}`` (DeepSpeed's form); the legacy
        ``curriculum_learning`` section one function."""
        if isinstance(schedule_func, dict):
            loader = getattr(self, "training_dataloader", None)
            sampler = getattr(loader, "data_sampler", None)
            if not hasattr(sampler, "set_custom_curriculum_learning_schedule"):
                raise ValueError("set_custom_curriculum_learning_schedule: a dict of schedules "
                                 "is for data_efficiency.data_sampling.curriculum_learning, "
                                 "with training_data given to initialize")
            sampler.set_custom_curriculum_learning_schedule(schedule_func)
            return
        scheduler = getattr(self, "curriculum_scheduler_legacy", None)
        if scheduler is None:
            raise ValueError("set_custom_curriculum_learning_schedule: the config's "
                             "curriculum_learning section is not enabled")
        scheduler.set_custom_get_difficulty(schedule_func)

    def get_pld_theta(self):
        """The progressive-layer-drop keep probability now (None when PLD is off)."""
        pld = getattr(self, "progressive_layer_drop", None)
        return None if pld is None else pld.get_theta()

    def pld_enabled(self) -> bool:
        return getattr(self, "progressive_layer_drop", None) is not None

    def eigenvalue_enabled(self) -> bool:
        return getattr(self, "eigenvalue", None) is not None

    def get_mom(self) -> list:
        """Per param group: ``momentum`` for SGD / RMSprop, ``betas`` otherwise (DeepSpeed's)."""
        if not self._trains:
            return []
        key = "momentum" if self.optimizer_name() in ("SGD", "RMSprop") else "betas"
        return [g[key] for g in self.optimizer.param_groups if key in g]

    @property
    def loss_scale(self) -> float:
        return self.precision.scaler.loss_scale

    def get_global_grad_norm(self):
        return self.strategy.grad_norm()

    # -- torch.compile -------------------------------------------------------------------------
    def compile(self, backend=None, compile_kwargs=None, schedule=None,
                compiled_autograd_enabled=False) -> None:
        """DeepSpeed's ``engine.compile(backend=, compile_kwargs=)`` (Accelerate calls it when a
        dynamo backend is set): torch.compile of the wrapped module, once; the engine's own
        forward, backward and step stay eager. (``nn.Module.compile`` would have compiled the
        engine's forward and refused ``compile_kwargs``.) DeepCompile's ``schedule`` and
        compiled autograd are not provided."""
        if schedule is not None or compiled_autograd_enabled:
            raise NotImplementedError(
                "engine.compile(schedule=...) / compiled_autograd_enabled=True are DeepCompile's; "
                "dslaunch compiles the module with torch.compile only: leave them out")
        if self.is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        kwargs["backend"] = backend or "inductor"  # torch.compile's default, as DeepSpeed's CPU/CUDA
        self.module.compile(**kwargs)
        self._is_compiled = True

    @property
    def is_compiled(self) -> bool:
        return self.__dict__.get("_is_compiled", False)

    # -- configuration -------------------------------------------------------------------------
    def fp16_enabled(self) -> bool:
        return self.precision.name == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self.precision.name == "bf16"

    def zero_optimization(self) -> bool:
        """Whether ZeRO is on (stage 1 or more), as DeepSpeed answers."""
        return self.zero_optimization_stage() > 0

    def zero_optimization_stage(self) -> int:
        return self.zero_stage

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return self._config.zero_optimization.stage3_gather_16bit_weights_on_model_save

    def optimizer_name(self):
        """The class name of the optimizer passed in; else the config's ``optimizer.type``
        (DeepSpeed's own optimizers in lower case); None without an optimizer."""
        if self._client_optimizer_name is not None:
            return self._client_optimizer_name
        if self._config.optimizer is None:
            return None
        name = str(self._config.optimizer.type)
        return name.lower() if name.lower() in _DEEPSPEED_OPTIMIZERS else name

    def wall_clock_breakdown(self) -> bool:
        return self._config.wall_clock_breakdown

    @property
    def mp_world_size(self) -> int:
        """Model-parallel (tensor-parallel) size: the mpu's or the pipeline grid's, else 1."""
        mpu = self.__dict__.get("mpu") or self.__dict__.get("grid")
        return mpu.get_model_parallel_world_size() if mpu is not None else 1

    def get_data_parallel_group(self):
        group = self.comm.group
        return group if group is not None else torch.distributed.group.WORLD

    @property
    def data_parallel_group(self):
        return self.get_data_parallel_group()

    def get_data_parallel_rank(self) -> int:
        return torch.distributed.get_rank(self.get_data_parallel_group())

    def get_model_parallel_rank(self) -> int:
        return parallel_groups._get_model_parallel_rank()

    def get_tensor_parallel_rank(self) -> int:
        return parallel_groups._get_tensor_model_parallel_rank()

    def get_sequence_parallel_group(self):
        return parallel_groups._get_sequence_parallel_group()

    # -- ZeRO-3 and life cycle -----------------------------------------------------------------
    def empty_partition_cache(self) -> None:
        """Release the ZeRO-3 parameters gathered now (persistent ones stay); call between
        passes (after an offload, before a long pause). Nothing to do under stages 0-2."""
        self.strategy.empty_partition_cache()

    def offload_states(self, include=None, device=OffloadDeviceEnum.cpu, pin_memory: bool = True,
                       non_blocking: bool = False) -> None:
        """Move the training states of the kinds in ``include`` (``OffloadStateTypeEnum``; all
        by default) to host memory, pinned if asked, until ``reload_states()``
        (``zero/offload_states.py``)."""
        self._states.offload(include, device, pin_memory, non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        """Move what ``offload_states()`` moved back where it was."""
        self._states.reload(non_blocking)

    def destroy(self) -> None:
        """Remove the hooks the strategy put on the model and drop its state; the engine cannot
        be used afterwards (frameworks call it to free memory between phases)."""
        from dslaunch.engine.zero.zero_init import unregister_strategy

        self.monitors.close()  # a tracker's run ends here (offline ones write their files)
        strategy = self.strategy
        strategy.empty_partition_cache()
        strategy.remove_hooks()
        unregister_strategy(strategy)
        self.strategy = _Destroyed()
        self.register_forward_pre_hook(_refuse_after_destroy)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """The whole model's state dict in the training dtype, on global rank 0 ({} on the
        others). Collective (stage 3 gathers bucket by bucket): every rank calls it."""
        if self.zero_optimization_stage() != 3:
            raise ValueError("_zero3_consolidated_16bit_state_dict requires ZeRO stage 3 (under "
                             "stages 0-2 every rank holds the whole model: use "
                             "engine.module.state_dict())")
        return self._whole_16bit_state(exclude_frozen_parameters)

    def _consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """The whole model's state dict in the training dtype, on global rank 0 ({} on the
        others): under ZeRO stage 3 gathered from the partitions, under tensor parallelism
        (AutoTP) from the TP slices, under both from both. Collective: every rank calls it."""
        from dslaunch.engine.parallel.autotp import has_tp_splits

        if self.zero_optimization_stage() != 3 and not has_tp_splits(self.module):
            raise ValueError("_consolidated_16bit_state_dict applies where the weights are "
                             "partitioned (ZeRO stage 3) or split (tensor parallelism); here "
                             "every rank holds the whole model: use engine.module.state_dict()")
        return self._whole_16bit_state(exclude_frozen_parameters)

    def _whole_16bit_state(self, exclude_frozen_parameters: bool) -> dict:
        from dslaunch.engine.parallel.autotp import gather_tp_state, has_tp_splits

        split = has_tp_splits(self.module)
        if self.zero_optimization_stage() == 3:
            # the TP gather needs every rank's whole (ZeRO-gathered) slices; else rank 0 keeps them
            state = self.strategy.module_state_dict(keep=split or self.global_rank == 0)
        else:
            state = self.strategy.module_state_dict()
        if split:
            state = gather_tp_state(state, self.module)
        if self.global_rank != 0:
            return {}
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return {k: v.detach().cpu() for k, v in state.items()}

    # -- the wrapped module's attributes -------------------------------------------------------
    def __getattr__(self, name: str):
        try:  # nn.Module's own: parameters, buffers, submodules (the wrapped module itself)
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__"):
                raise
        module = self.__dict__.get("_modules", {}).get("module")
        if module is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(nor has its module, a {type(module).__name__})") from None
