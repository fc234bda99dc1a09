"""``PipelineEngine``: runs a ``PipelineModule``'s stage on this rank through a schedule's
instruction stream (``schedule.py``), moving activations and gradients with ``p2p.py``.

One ``train_batch(data_iter)`` = ``gradient_accumulation_steps`` micro-batches pulled from
``data_iter`` (on the first stage for the inputs, on the last for the labels; each item is
``(inputs, labels)``; without ``data_iter``, the one given last, or one pass after another over
``training_data``), forward and backward per the schedule (1F1B by default, GPipe with
``{"dslaunch": {"pipe_schedule": "gpipe"}}`` or ``engine.pipe_schedule = "gpipe"``), the tied
weights' gradients summed over their owner stages, and one optimizer step. Gradients are
averaged over the data-parallel group by the ZeRO strategy (stage 0's buckets), built on the
grid's data-parallel ``Comm``. The batch loss (mean over micro-batches, averaged over the data
ranks) is returned on every stage.

Everything else (optimizer, precision, LR schedule, counters, monitors) is ``DSLaunchEngine``'s.

Under ``dslaunch run --recover in-process`` a lost peer met inside ``train_batch`` is recovered
there and the batch runs again (``engine/recovery/pipe.py``, ``recovery/guard.py``); for that the batch loss is
aggregated at the ``step`` instruction, before the update, so that every collective of a batch
comes before any rank's update.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
import torch.distributed as dist

from dslaunch.engine.base.dataloader import RepeatingLoader
from dslaunch.engine.core.engine import DSLaunchEngine
from dslaunch.engine.parallel.pipe.batch_state import BatchState, OpClock, PostedReceives
from dslaunch.engine.parallel.pipe.module import PipelineModule
from dslaunch.engine.parallel.pipe.p2p import P2P
from dslaunch.engine.parallel.pipe.schedule import get_schedule, inference


def _floats(obj) -> list:
    items = obj if isinstance(obj, (tuple, list)) else (obj,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]


class PipelineEngine(DSLaunchEngine):
    # DeepSpeed's PipelineEngine serves training_data= in order (its sampler does not shuffle)
    _shuffle_training_data = False
    pipeline_parallelism = True

    def __init__(self, *, args, model: PipelineModule, optimizer, model_parameters, training_data,
                 lr_scheduler, collate_fn, cfg, recovery=None):
        grid = model.grid
        if not model.activation_checkpoint_interval:
            model.activation_checkpoint_interval = cfg.pipeline.activation_checkpoint_interval
        model.sync_tied_weights()  # before the strategy takes fp32 masters
        object.__setattr__(self, "grid", grid)  # deepspeed_io (called by super) needs it
        super().__init__(args=args, model=model, optimizer=optimizer,
                         model_parameters=model_parameters, training_data=training_data,
                         lr_scheduler=lr_scheduler, collate_fn=collate_fn, cfg=cfg,
                         comm=grid.data_parallel_comm(), recovery=recovery)
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.dp_world_size = grid.dp_world_size
        self.num_stages, self.stage_id = grid.num_stages, grid.stage_id
        self.micro_batches = self._gas
        self.pipe_schedule = cfg.dslaunch.pipe_schedule
        self.p2p = P2P(self.device)
        self.peak_live_micro_batches = 0  # most micro-batches of activations held at once
        # seconds per instruction kind, summed over train batches (bench_pipe: busy vs wall)
        self.pipe_times: dict = defaultdict(float)
        # bench_pipe sets it: count the bytes autograd saves per micro-batch (a hook per tensor)
        self.measure_activations = False
        self.peak_activation_bytes = 0
        # ZeRO 1 reduce-scatters in the boundary after_backward, so tied gradients must be summed
        # before it: that reduction then waits for the reduce_tied instruction (doing it inside
        # the backward instruction would block before send_grad: a deadlock)
        self._tied_early = self.zero_stage >= 1 and bool(model.tied_groups)
        _install_norm(self, grid.tp_rank, grid.tp_world_size, grid.dp_rank,
                      grid.num_stages * grid.tp_world_size)

    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True):
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(dataset, num_replicas=self.grid.dp_world_size,
                                     rank=self.grid.dp_rank, shuffle=shuffle)
        return DataLoader(dataset, batch_size=batch_size or self._micro_batch, sampler=sampler,
                          collate_fn=collate_fn)

    def set_train_batch_size(self, train_batch_size: int) -> None:
        super().set_train_batch_size(train_batch_size)
        self.micro_batches = self._gas  # one train_batch() runs the new accumulation

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    # -- DeepSpeed's pipeline API --------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise RuntimeError("PipelineEngine: call engine.train_batch(data_iter) / "
                           "engine.eval_batch(data_iter), not engine(batch)")

    def backward(self, *args, **kwargs):
        raise RuntimeError("PipelineEngine: train_batch() runs backward itself")

    def train_batch(self, data_iter=None):
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns the
        batch's mean loss (a 0-dim tensor) on every stage."""
        self._states.check_loaded("train_batch()")
        data_iter = self._data_iter(data_iter)
        return self._recovery.train_batch(self, data_iter)  # (in process: a lost peer survived)

    def _run_batch(self, data_iter):
        self.module.train()
        self.tput_timer.start()
        schedule = get_schedule(self.pipe_schedule)
        instrs = schedule(self.num_stages, self.stage_id, self.micro_batches)
        self._applied = False
        # its "step" aggregates the loss (_batch_loss), then steps the optimizer
        self._execute(instrs, data_iter, train=True)
        loss = self._batch_loss
        self._losses = [loss.detach()]
        self._after_step(self._applied)
        self.tput_timer.stop(global_step=True)
        if self._autotune is not None:  # an autotuning trial: measure, write the metric, exit
            self._autotune.after_step(self)
        return loss

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg"):
        """Forward only over ``gradient_accumulation_steps`` micro-batches; the mean loss on every
        stage (with ``return_logits``: ``(loss, [last stage outputs])``, outputs on the last
        stage only)."""
        data_iter = self._data_iter(data_iter, keep=False)
        was_training = self.module.training
        self.module.eval()
        self._eval_outputs = []
        self._compute_loss = compute_loss
        try:  # (its collectives are the engine's: a lost peer here is not recovered)
            with torch.no_grad(), self._recovery.engine_call(self):
                losses = self._execute(inference(self.num_stages, self.stage_id,
                                                 self.micro_batches), data_iter, train=False)
                loss = self._aggregate(losses) if compute_loss else None
        finally:
            self.module.train(was_training)
            self._compute_loss = True
        return (loss, self._eval_outputs) if return_logits else loss

    # -- checkpoints: one file per (stage, TP rank) + metadata (checkpoint/pipeline.py) -------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        from dslaunch.engine.checkpoint import pipeline as pipe_ckpt
        return self._recovery.save(self, lambda: pipe_ckpt.save(
            self, save_dir, tag=tag, client_state=client_state, save_latest=save_latest,
            exclude_frozen_parameters=exclude_frozen_parameters))

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        from dslaunch.engine.checkpoint import pipeline as pipe_ckpt
        if self._recovery.holds_live_state(self):
            return None, {}
        with self._recovery.engine_call(self):
            loaded = pipe_ckpt.load(self, load_dir, tag=tag, strict=load_module_strict,
                                    load_optimizer_states=load_optimizer_states,
                                    load_lr_scheduler_states=load_lr_scheduler_states,
                                    load_module_only=load_module_only)
        self._publish_step_state(overflow=False)  # the loss scale may have been restored
        return loaded

    def set_dataiterator(self, iterator) -> None:
        """The iterator later ``train_batch()`` calls without ``data_iter`` pull from."""
        self.data_iterator = iterator

    def set_dataloader(self, loader) -> None:
        """Pull from ``loader`` from now on, starting it over whenever it ends."""
        self.data_iterator = iter(RepeatingLoader(loader))

    def _data_iter(self, data_iter, keep: bool = True):
        """``data_iter``, kept for later calls when ``keep`` (DeepSpeed's train_batch does so);
        else the one kept: one pass over the training data across train_batch() calls, not its
        first batches again every time."""
        if data_iter is not None:
            if keep:
                self.set_dataiterator(data_iter)
            return data_iter
        if self.__dict__.get("data_iterator") is None and self.training_dataloader is not None:
            self.set_dataloader(self.training_dataloader)
        data_iter = self.__dict__.get("data_iterator")
        if data_iter is None and (self.is_first_stage() or self.is_last_stage()):
            raise ValueError("PipelineEngine: train_batch() needs data_iter= on the first and "
                             "last stages (or training_data= at initialize)")
        return data_iter

    # -- the executor: one short method per instruction op, looked up in _INSTRUCTIONS ---------
    def _execute(self, instrs, data_iter, train: bool) -> list:
        receives = PostedReceives(self.p2p, instrs, {"recv_act": (self.grid.prev_rank, "act"),
                                                     "recv_grad": (self.grid.next_rank, "grad")})
        receives.post_first()
        # an eval batch's timings are thrown away: pipe_times describes training
        st = BatchState(data_iter=data_iter, train=train, first=self.is_first_stage(),
                        last=self.is_last_stage(),
                        backward_scale=self.precision.scaler.loss_scale / self.micro_batches,
                        receives=receives,
                        clock=OpClock(self.pipe_times if train else defaultdict(float)))
        for ins in instrs:
            st.clock.tick(ins.op)
            run = self._INSTRUCTIONS.get(ins.op)
            if run is None:
                raise RuntimeError(f"PipelineEngine: unknown instruction {ins}")
            run(self, st, ins.micro)
        t_end = st.clock.tick()
        self.p2p.wait_all()
        st.clock.times["wait_sends"] += time.perf_counter() - t_end
        st.clock.times["total"] += time.perf_counter() - st.clock.start
        return st.losses

    def _op_load(self, st: BatchState, m: int) -> None:
        batch = next(st.data_iter)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError("PipelineEngine: data_iter must yield (inputs, labels)")
        x, y = batch
        if st.first:
            x = self.precision.cast_inputs(self._to_device(x))
            st.inputs[m] = x
            if isinstance(x, torch.Tensor) and not x.is_floating_point():
                self._tokens += x.numel()
        if st.last:
            st.labels[m] = self._to_device(y)

    def _op_recv_act(self, st: BatchState, m: int) -> None:
        x = st.receives.recv("recv_act")
        if st.train:  # backward needs the gradients of this stage's inputs
            for t in _floats(x):
                t.requires_grad_(True)
        st.inputs[m] = x

    def _op_forward(self, st: BatchState, m: int) -> None:
        counting = st.train and self.measure_activations
        with _count_saved(st.act_bytes, m, self.module) if counting else \
                contextlib.nullcontext():
            out = self.module(_for_forward(st.inputs[m]) if st.train and not st.first
                              else st.inputs[m])
        if counting:
            st.live_bytes += st.act_bytes[m]
            self.peak_activation_bytes = max(self.peak_activation_bytes, st.live_bytes)
        if st.last:
            out = self._loss_of(st, m, out)
        if st.train:
            st.outputs[m] = out
            st.live += 1
            self.peak_live_micro_batches = max(self.peak_live_micro_batches, st.live)
        else:  # nothing is kept for a backward
            st.inputs.pop(m, None)
            if not st.last:
                st.outputs[m] = out

    def _loss_of(self, st: BatchState, m: int, out):
        """Last stage: the loss of micro-batch ``m`` (recorded in ``st.losses``), or ``out``
        itself without a loss_fn (eval: the outputs are kept for return_logits)."""
        if not st.train:
            self._eval_outputs.append(out)
        if self.module.loss_fn is not None and getattr(self, "_compute_loss", True):
            out = self.module.loss_fn(out, st.labels.pop(m))
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            st.losses.append(out.detach().float())
        return out

    def _op_send_act(self, st: BatchState, m: int) -> None:
        out = st.outputs[m] if st.train else st.outputs.pop(m)
        self.p2p.send(_detach(out), self.grid.next_rank, "act")

    def _op_recv_grad(self, st: BatchState, m: int) -> None:
        st.grads_out[m] = st.receives.recv("recv_grad")

    def _op_backward(self, st: BatchState, m: int) -> None:
        boundary = st.backwards_done == self.micro_batches - 1
        self.strategy.prepare_backward(boundary)
        out = st.outputs.pop(m)
        if st.last:
            (out.float() * st.backward_scale).backward()
        else:
            g = st.grads_out.pop(m)
            g = list(g) if isinstance(g, tuple) else [g]
            pairs = [(t, gt) for t, gt in zip(_floats(out), g) if t.requires_grad]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [gt for _, gt in pairs])
        self.strategy.after_backward(boundary and not self._tied_early)
        st.backwards_done += 1
        st.live -= 1
        st.live_bytes -= st.act_bytes.pop(m, 0)
        x = st.inputs.pop(m)
        if not st.first:  # what send_grad hands the previous stage
            st.grads_in[m] = _input_grads(x)

    def _op_send_grad(self, st: BatchState, m: int) -> None:
        self.p2p.send(st.grads_in.pop(m), self.grid.prev_rank, "grad")

    def _op_reduce_tied(self, st: BatchState, m: int) -> None:
        if self._tied_early:
            self.module.allreduce_tied_weight_gradients()
            self.strategy.after_backward(True)  # the deferred boundary reduction
            return
        views = getattr(self.strategy, "views", None)
        self.module.allreduce_tied_weight_gradients(
            grad_of=(lambda p: views.get(p)) if views is not None else None)

    def _op_step(self, st: BatchState, m: int) -> None:
        # the loss first: then every collective of a batch comes before its update, and a lost
        # peer interrupts a batch that no rank has stepped yet (engine/recovery/pipe.py). The stages
        # meet here anyway: the step's gradient norm is all-reduced over the world (grad_norm.py)
        self._batch_loss = self._aggregate(st.losses)
        self._applied = self._optimizer_step()

    # op -> method(self, batch state, micro-batch); the ops are schedule.py's
    _INSTRUCTIONS = {"load": _op_load, "recv_act": _op_recv_act, "forward": _op_forward,
                     "send_act": _op_send_act, "recv_grad": _op_recv_grad,
                     "backward": _op_backward, "send_grad": _op_send_grad,
                     "reduce_tied": _op_reduce_tied, "step": _op_step}

    def _to_device(self, x):
        if isinstance(x, torch.Tensor):
            return x.to(self.device)
        if isinstance(x, (tuple, list)):
            return type(x)(self._to_device(t) for t in x)
        return x

    def _aggregate(self, losses: list) -> torch.Tensor:
        """Mean over micro-batches on the last stage, averaged over its data-parallel group,
        then broadcast from the last stage to every stage."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.is_last_stage() and losses:
            loss = torch.stack(losses).mean()
            if self.grid.dp_world_size > 1:
                dist.all_reduce(loss, group=self.grid.data_group)
                loss /= self.grid.dp_world_size
        if self.num_stages > 1:
            dist.broadcast(loss, group=self.grid.pipe_group, group_src=self.num_stages - 1)
        return loss

    def _optimizer_step(self) -> bool:
        self.timers.start("step")
        applied = self.strategy.step(self._clip, self.precision.scaler)
        self.strategy.zero_grad()
        self._record_step(applied)
        if applied:
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        else:
            self.skipped_steps += 1
        self.global_steps += 1
        if self._progress is not None:
            self._progress.step(self.global_steps)
        self.global_samples += self._train_batch
        self.micro_steps += self.micro_batches
        self.timers.stop("step")
        if self._faults is not None:
            self._faults.at_step(self.global_steps)
        return applied


@contextlib.contextmanager
def _count_saved(act_bytes: dict, m: int, module):
    """Bytes of the tensors autograd saves for backward during this forward (parameters and
    storages already counted excluded): the activations micro-batch ``m`` stashes."""
    seen = {p.data_ptr() for p in module.parameters()}
    act_bytes[m] = 0

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            act_bytes[m] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _input_grads(x):
    """The gradients of a stage's inputs after its backward (zeros where autograd left none),
    a tuple when the inputs were one."""
    grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in _floats(x))
    return grads if isinstance(x, (tuple, list)) else grads[0]


def _for_forward(x):
    """A stage's received inputs as its forward gets them in training: clones, so a first layer
    that works in place (``ReLU(inplace=True)``) does not write into the leaves whose gradients
    go back to the previous stage (autograd refuses that); DeepSpeed clones them too."""
    if isinstance(x, (tuple, list)):
        return type(x)(t.clone() if isinstance(t, torch.Tensor) else t for t in x)
    return x.clone() if isinstance(x, torch.Tensor) else x


def _detach(out):
    if isinstance(out, (tuple, list)):
        return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in out)
    return out.detach()


def tensor_parallel_engine(*, mpu, cfg, **engine_args) -> DSLaunchEngine:
    """``dslaunch.initialize`` for a model with an ``mpu`` (tensor and/or sequence parallel, no
    pipeline): a ``DSLaunchEngine`` reducing gradients over the mpu's data group (with sequence
    parallelism: its sequence x data group, the ranks holding the same weights; the batch triad
    still counts data-parallel ranks only), its gradient norm taken over the whole model."""
    from dslaunch.engine.parallel.sequence.layout import mpu_sequence_parallel_size
    from dslaunch.engine.parallel.topology import GroupComm

    data_parallel = None
    group = mpu.get_data_parallel_group()
    if mpu_sequence_parallel_size(mpu) > 1:
        group = mpu.get_sequence_data_parallel_group()
        data_parallel = (mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank())
    engine = DSLaunchEngine(cfg=cfg, comm=GroupComm(group), data_parallel=data_parallel,
                            **engine_args)
    engine.mpu = mpu
    engine.global_rank, engine.world_size = dist.get_rank(), dist.get_world_size()
    tp = getattr(mpu, "get_model_parallel_world_size", lambda: 1)()
    if tp > 1:
        _install_norm(engine, mpu.get_model_parallel_rank(), tp, mpu.get_data_parallel_rank(), tp)
    return engine


def _install_norm(engine, tp_rank, tp_world, dp_rank, model_parallel_size) -> None:
    """Gradient clipping and the non-finite check (which skips the step in every precision,
    engine/base/step_policy.py) need the norm of the whole model, not of this stage / TP slice: route
    the strategy's step through ``grad_norm.py`` whenever the model is split, so that every
    stage and TP rank takes the same skip decision."""
    if model_parallel_size > 1:
        from dslaunch.engine.parallel.pipe.grad_norm import install

        install(engine.strategy, engine.module, tp_rank, tp_world, dp_rank)
