"""Activation checkpointing with DeepSpeed's interface (``deepspeed.checkpointing``; public as
``dslaunch.checkpointing``).

``checkpoint(function, *args)`` runs ``function`` without keeping its intermediate tensors: only
its inputs are saved, and backward runs it again, with the random state it first ran with, to
rebuild them. So the saved-tensor bytes of a checkpointed block are its inputs, and outputs and
gradients are bit-identical to running the block plainly, dropout included.

What is saved of each floating-point input (``configure``, or the config's
``activation_checkpointing`` section applied by ``dslaunch.initialize``):

- ``partition_activations``: only this rank's 1/tp slice (the inputs of a tensor-parallel block
  are the same on every rank of its tensor-parallel group); backward gathers the slices.
- ``checkpoint_in_cpu`` (``cpu_checkpointing``): the saved copy lives in host memory and goes
  back to the device for backward. On a CPU-only host the tensors are in host memory already,
  so it changes nothing there.
- ``contiguous_checkpointing``: accepted with DeepSpeed's rules (needs ``partition_activations``
  and ``num_checkpoints``); DeepSpeed copies the slices into preallocated buffers to spare the
  GPU caching allocator fragmentation. Here each slice is its own tensor: same results, no
  buffers.
- ``synchronize``: the accelerator is synchronised at the start and end of each checkpointed
  forward and backward; ``profile``: rank 0 logs each one's time.

Random state: the CPU generator, the accelerator's (when it is not the CPU), the states of the
model-parallel tracker (``get_cuda_rng_tracker``, seeded per tensor-parallel rank by
``model_parallel_cuda_manual_seed``, as Megatron does) and those of dslaunch's tensor-parallel
layers' tracker are recorded before the forward and put back for the recomputation, which also
runs under the autocast state the forward ran under.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from dslaunch.accelerator.real_accelerator import get_accelerator
from dslaunch.engine.base.log import logger

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
_TP_SEED_OFFSET = 2718  # DeepSpeed's and Megatron's: the tensor-parallel seeds are seed + this + rank

# DeepSpeed's module state, under its names (Megatron-DeepSpeed reads some of them)
deepspeed_checkpointing_enabled = False
mpu = None
mp_rank, mp_size, mp_group = 0, 1, None
num_layers = None
PARTITION_ACTIVATIONS = False
CPU_CHECKPOINT = False
CONTIGUOUS_CHECKPOINTING = False
SYNCHRONIZE = False
PROFILE_TIME = False


# -- random state ---------------------------------------------------------------------------------

def _device_rng_used() -> bool:
    """Whether the accelerator has a generator of its own (not the CPU's, saved anyway)."""
    return get_accelerator().device_name() != "cpu"


class CudaRNGStatesTracker:
    """Named random states of the accelerator (DeepSpeed's / Megatron's class): ``add`` seeds
    one, ``fork`` runs a block with it and keeps where it got to. Tensor-parallel layers draw
    their dropout from the "model-parallel-rng" state, different on each tensor-parallel rank;
    the default generator stays the same across them."""

    def __init__(self):
        self.states_ = {}
        self.seeds_ = set()

    def reset(self):
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self):
        return dict(self.states_)  # fork replaces a state, never changes one in place

    def set_states(self, states):
        self.states_ = states

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        accel = get_accelerator()
        before = accel.get_rng_state()
        accel.manual_seed(seed)
        self.states_[name] = accel.get_rng_state()
        accel.set_rng_state(before)

    @contextlib.contextmanager
    def fork(self, name=_MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        accel = get_accelerator()
        before = accel.get_rng_state()
        accel.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = accel.get_rng_state()
            accel.set_rng_state(before)


_CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _CUDA_RNG_STATE_TRACKER


def _tp_rank() -> int:
    if mpu is not None:
        fn = getattr(mpu, "get_tensor_model_parallel_rank", None) or mpu.get_model_parallel_rank
        return fn()
    if not dist.is_initialized():
        return 0
    from dslaunch.engine.parallel.groups import tensor_model_parallel_rank

    return tensor_model_parallel_rank()


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default generator with ``seed`` (the same on every tensor-parallel rank) and the
    tracker's model-parallel state with ``seed + 2718 + tp_rank`` (different on each)."""
    tp_rank = _tp_rank()
    _CUDA_RNG_STATE_TRACKER.reset()
    get_accelerator().manual_seed(seed)
    _CUDA_RNG_STATE_TRACKER.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, seed + _TP_SEED_OFFSET + tp_rank)


def model_parallel_reconfigure_tp_seed(seed: int) -> None:
    with _CUDA_RNG_STATE_TRACKER.fork():
        get_accelerator().manual_seed(seed + _TP_SEED_OFFSET + _tp_rank())


def _rng_snapshot():
    """Every random state a block may draw from: the CPU's, the accelerator's, this module's
    tracker and the one of dslaunch's tensor-parallel layers (``tensor_parallel.get_rng_tracker``)."""
    from dslaunch.engine.parallel.tensor_parallel import get_rng_tracker

    device = get_accelerator().get_rng_state() if _device_rng_used() else None
    return (torch.get_rng_state(), device, _CUDA_RNG_STATE_TRACKER.get_states(),
            dict(get_rng_tracker().states))


def _rng_restore(snapshot) -> None:
    from dslaunch.engine.parallel.tensor_parallel import get_rng_tracker

    cpu, device, tracked, tp_layers = snapshot
    torch.set_rng_state(cpu)
    if device is not None:
        get_accelerator().set_rng_state(device)
    _CUDA_RNG_STATE_TRACKER.set_states(tracked)
    get_rng_tracker().states = tp_layers


# -- what is saved of an input --------------------------------------------------------------------

def is_activation_to_checkpoint(item) -> bool:
    """A floating-point tensor that may be partitioned / moved to host memory (DeepSpeed's rule,
    including its ``no_checkpointing`` opt-out attribute)."""
    return (torch.is_tensor(item) and item.is_floating_point() and item.numel() >= mp_size
            and not getattr(item, "no_checkpointing", False))


def _stash(t: torch.Tensor):
    """(what to save, how to rebuild) for a floating-point input."""
    shape, device = t.shape, t.device
    if PARTITION_ACTIVATIONS and mp_size > 1:
        flat = t.detach().reshape(-1)
        part = -(-flat.numel() // mp_size)  # padded so that every size splits
        if part * mp_size != flat.numel():
            flat = torch.cat([flat, flat.new_zeros(part * mp_size - flat.numel())])
        saved = flat.narrow(0, part * mp_rank, part).clone()
    else:
        saved = t.detach()
    if CPU_CHECKPOINT and saved.device.type != "cpu":
        saved = saved.to("cpu")
    return saved, (shape, device, PARTITION_ACTIVATIONS and mp_size > 1)


def _unstash(saved: torch.Tensor, how) -> torch.Tensor:
    shape, device, partitioned = how
    saved = saved.to(device)
    if partitioned:
        parts = [torch.empty_like(saved) for _ in range(mp_size)]
        dist.all_gather(parts, saved.contiguous(), group=mp_group)
        numel = 1
        for n in shape:
            numel *= n
        saved = torch.cat(parts)[:numel]
    return saved.view(shape)


# -- the function ---------------------------------------------------------------------------------

@contextlib.contextmanager
def _boundary(what: str):
    """``synchronize`` and ``profile`` around a checkpointed forward or backward."""
    if SYNCHRONIZE:
        get_accelerator().synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if SYNCHRONIZE:
            get_accelerator().synchronize()
        if PROFILE_TIME and (not dist.is_initialized() or dist.get_rank() == 0):
            logger.info(f"activation checkpointing: {what} {1e3 * (time.perf_counter() - start):.2f} ms")


def _tensors(outputs):
    return (outputs,) if torch.is_tensor(outputs) else tuple(o for o in outputs if torch.is_tensor(o))


class CheckpointFunction(torch.autograd.Function):
    """Runs ``run_function`` under no_grad, saves its inputs (as configured), and in backward runs
    it again with the recorded random and autocast state, then backpropagates through that."""

    @staticmethod
    def forward(ctx, run_function, all_outputs, *args):
        with _boundary("forward"):
            ctx.run_function = run_function
            ctx.rng = _rng_snapshot()
            device_type = get_accelerator().device_name()
            ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                            torch.get_autocast_dtype(device_type))
            with torch.no_grad():
                outputs = run_function(*args)
            saved, ctx.layout = [], []  # layout: per arg, ("tensor", how) or ("object", value)
            for arg in args:
                if is_activation_to_checkpoint(arg):
                    kept, how = _stash(arg)
                    saved.append(kept)
                    ctx.layout.append(("tensor", how, arg.requires_grad))
                elif torch.is_tensor(arg):
                    saved.append(arg)
                    ctx.layout.append(("tensor", None, arg.requires_grad))
                else:
                    ctx.layout.append(("object", arg, False))
            ctx.save_for_backward(*saved)
        all_outputs.append(outputs)
        tensors = _tensors(outputs)
        ctx.mark_non_differentiable(*[t for t in tensors if not t.is_floating_point()])
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("activation checkpointing works with .backward(), not with "
                               "torch.autograd.grad()")
        with _boundary("backward"):
            saved = iter(ctx.saved_tensors)
            inputs = []
            for kind, how, requires_grad in ctx.layout:
                if kind == "object":
                    inputs.append(how)
                    continue
                t = next(saved)
                t = (_unstash(t, how) if how is not None else t).detach()
                inputs.append(t.requires_grad_(requires_grad))
            now = _rng_snapshot()
            _rng_restore(ctx.rng)
            device_type, autocast_on, autocast_dtype = ctx.autocast
            try:
                with torch.enable_grad(), torch.autocast(device_type, dtype=autocast_dtype,
                                                          enabled=autocast_on):
                    outputs = ctx.run_function(*inputs)
            finally:
                _rng_restore(now)
            pairs = [(o, g) for o, g in zip(_tensors(outputs), grads)
                     if o.requires_grad and g is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *[x.grad if torch.is_tensor(x) else None for x in inputs])


def checkpoint(function, *args, **kwargs):
    """``function(*args, **kwargs)`` with its activations checkpointed: returns what it returns.
    Tensors passed by keyword take part in autograd as positional ones do."""
    if kwargs:
        keys, n_positional, run = tuple(kwargs), len(args), function

        def function(*all_args):
            return run(*all_args[:n_positional], **dict(zip(keys, all_args[n_positional:])))

        args = args + tuple(kwargs.values())
    all_outputs = []
    CheckpointFunction.apply(function, all_outputs, *args)
    return all_outputs[0]


# -- configuration --------------------------------------------------------------------------------

def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    global PARTITION_ACTIVATIONS
    PARTITION_ACTIVATIONS = partition_activation


def set_num_layers(nlayers) -> None:
    global num_layers
    num_layers = nlayers


def reset() -> None:
    """DeepSpeed frees its contiguous checkpoint buffers here (after evaluation forwards that no
    backward consumed); every saved input here belongs to its own autograd node and goes with
    it, so there is nothing to free."""


def _from_config(deepspeed_config) -> dict:
    """The ``activation_checkpointing`` section of a config (dict or file path), as
    ``configure``'s keyword arguments."""
    from dslaunch.config import resolve_config

    world = dist.get_world_size() if dist.is_initialized() else None
    section = resolve_config(deepspeed_config, world_size=world).typed.activation_checkpointing
    return dict(partition_activations=section.partition_activations,
                contiguous_checkpointing=section.contiguous_memory_optimization,
                num_checkpoints=section.number_checkpoints,
                checkpoint_in_cpu=section.cpu_checkpointing,
                synchronize=section.synchronize_checkpoint_boundary, profile=section.profile)


def configure(mpu_, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None) -> None:
    """DeepSpeed's ``configure``: defaults, then ``deepspeed_config``'s ``activation_checkpointing``
    section, then the keyword arguments given (not None). ``mpu_``: an object with
    ``get_(tensor_)model_parallel_rank/world_size/group`` (None keeps the one given before); its
    tensor-parallel group is the one ``partition_activations`` splits over."""
    global mpu, num_layers, deepspeed_checkpointing_enabled, mp_rank, mp_size, mp_group
    global PARTITION_ACTIVATIONS, CONTIGUOUS_CHECKPOINTING, CPU_CHECKPOINT, SYNCHRONIZE, PROFILE_TIME
    values = dict(partition_activations=False, contiguous_checkpointing=False,
                  num_checkpoints=None, checkpoint_in_cpu=False, synchronize=False, profile=False)
    if deepspeed_config is not None:
        values.update(_from_config(deepspeed_config))
    given = dict(partition_activations=partition_activations,
                 contiguous_checkpointing=contiguous_checkpointing,
                 num_checkpoints=num_checkpoints, checkpoint_in_cpu=checkpoint_in_cpu,
                 synchronize=synchronize, profile=profile)
    values.update({k: v for k, v in given.items() if v is not None})
    if values["contiguous_checkpointing"] and not values["partition_activations"]:
        raise ValueError("activation checkpointing: contiguous_checkpointing "
                         "(contiguous_memory_optimization) needs partition_activations")
    if values["contiguous_checkpointing"] and values["num_checkpoints"] is None:
        raise ValueError("activation checkpointing: contiguous_checkpointing needs "
                         "num_checkpoints (number_checkpoints)")
    if mpu_ is not None:
        mpu = mpu_
    PARTITION_ACTIVATIONS = bool(values["partition_activations"])
    CONTIGUOUS_CHECKPOINTING = bool(values["contiguous_checkpointing"])
    num_layers = values["num_checkpoints"]
    CPU_CHECKPOINT = bool(values["checkpoint_in_cpu"])
    SYNCHRONIZE = bool(values["synchronize"])
    PROFILE_TIME = bool(values["profile"])
    if mpu is not None:
        if hasattr(mpu, "get_tensor_model_parallel_rank"):
            mp_rank = mpu.get_tensor_model_parallel_rank()
            mp_size = mpu.get_tensor_model_parallel_world_size()
            mp_group = mpu.get_tensor_model_parallel_group()
        else:
            mp_rank = mpu.get_model_parallel_rank()
            mp_size = mpu.get_model_parallel_world_size()
            mp_group = mpu.get_model_parallel_group()
    else:
        mp_rank, mp_size, mp_group = 0, 1, None
    deepspeed_checkpointing_enabled = True
    if not dist.is_initialized() or dist.get_rank() == 0:
        logger.info(f"activation checkpointing: partition_activations {PARTITION_ACTIVATIONS} "
                    f"(over {mp_size} tensor-parallel ranks), cpu_checkpointing {CPU_CHECKPOINT}, "
                    f"contiguous {CONTIGUOUS_CHECKPOINTING} ({num_layers} checkpoints), "
                    f"synchronize {SYNCHRONIZE}, profile {PROFILE_TIME}")


def is_configured() -> bool:
    """True once ``configure`` ran (``dslaunch.initialize`` runs it for a config that writes a key
    of ``activation_checkpointing``)."""
    return deepspeed_checkpointing_enabled


def _unconfigure() -> None:
    """Back to the state before any ``configure`` (tests)."""
    global mpu, num_layers, deepspeed_checkpointing_enabled, mp_rank, mp_size, mp_group
    global PARTITION_ACTIVATIONS, CONTIGUOUS_CHECKPOINTING, CPU_CHECKPOINT, SYNCHRONIZE, PROFILE_TIME
    mpu, num_layers, deepspeed_checkpointing_enabled = None, None, False
    mp_rank, mp_size, mp_group = 0, 1, None
    PARTITION_ACTIVATIONS = CONTIGUOUS_CHECKPOINTING = CPU_CHECKPOINT = False
    SYNCHRONIZE = PROFILE_TIME = False
