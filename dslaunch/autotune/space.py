"""The experiments of a search and the pruning that needs no trial.

An experiment is (ZeRO stage, optimizer offload, parameter offload, micro-batch per rank); a
"group" is the same without the micro-batch. Pruned before any trial, each with its reason:
- combinations the engine refuses (optimizer offload needs stage >= 1, parameter offload stage 3);
- micro-batches outside ``min/max_train_batch_size`` (x accumulation x data-parallel ranks) and
  ``min/max_train_micro_batch_size_per_gpu``;
- groups whose model states (parameters, gradients, optimizer states, from
  ``engine/zero/memory_estimate.py``) do not fit the memory of one rank (device) or of one host
  (CPU offload). Activations are not modelled: a micro-batch that does not fit shows as an
  out-of-memory trial, and then every larger micro-batch of its group is skipped (``tuners.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dslaunch.engine.zero.memory_estimate import OPTIMIZER_STATES, estimate, human


@dataclass(frozen=True)
class Experiment:
    stage: int
    offload_optimizer: str
    offload_param: str
    micro_batch: int

    @property
    def group(self) -> tuple:
        return (self.stage, self.offload_optimizer, self.offload_param)

    @property
    def name(self) -> str:
        off = ""
        if self.offload_optimizer != "none":
            off += f"_oo-{self.offload_optimizer}"
        if self.offload_param != "none":
            off += f"_op-{self.offload_param}"
        return f"z{self.stage}{off}_mbs{self.micro_batch}"

    def to_dict(self) -> dict:
        return asdict(self)


def generated_micro_batches(section, gas: int, dp: int) -> list:
    """Powers of two from the section's minimum up to the largest size its bounds allow (that
    size itself included), thinned to ``num_tuning_micro_batch_sizes`` evenly spaced ones that
    keep the largest."""
    lo = section.min_train_micro_batch_size_per_gpu
    hi = section.max_train_micro_batch_size_per_gpu
    if section.max_train_batch_size is not None:
        hi = min(hi, section.max_train_batch_size // (gas * dp))
    if hi < lo:
        return []
    sizes, m = [], lo
    while m <= hi:
        sizes.append(m)
        m *= 2
    if sizes[-1] != hi:
        sizes.append(hi)
    want = section.num_tuning_micro_batch_sizes
    if len(sizes) > want:
        step = (len(sizes) - 1) / max(want - 1, 1)
        picked = sorted({sizes[len(sizes) - 1 - round(i * step)] for i in range(want)})
        sizes = picked
    return sizes


def build_space(tin, dp: int) -> tuple[list, list]:
    """(experiments, pruned) where pruned is [(experiment, reason)]; experiments come in grid
    order: stage, then offload, then micro-batch ascending."""
    section = tin.section
    micro = tin.micro_batches or generated_micro_batches(section, tin.gas, dp)
    experiments, pruned = [], []
    for stage in tin.stages:
        for oo in tin.offload_optimizer:
            for op in tin.offload_param:
                if oo != "none" and stage == 0:
                    continue  # not a configuration (the engine refuses it)
                if op != "none" and stage != 3:
                    continue
                for m in sorted(set(micro)):
                    exp = Experiment(stage, oo, op, m)
                    batch = m * tin.gas * dp
                    if section.max_train_batch_size is not None and \
                            batch > section.max_train_batch_size:
                        pruned.append((exp, f"batch {batch} > autotuning.max_train_batch_size "
                                            f"{section.max_train_batch_size}"))
                    elif batch < section.min_train_batch_size:
                        pruned.append((exp, f"batch {batch} < autotuning.min_train_batch_size "
                                            f"{section.min_train_batch_size}"))
                    else:
                        experiments.append(exp)
    return experiments, pruned


def memory_pruned(experiments: list, num_params: int, world_size: int, ranks_per_host: int,
                  precision: str, optimizer: str, device_bytes: int | None,
                  host_bytes: int | None) -> tuple[list, list]:
    """Split ``experiments`` into (fitting, [(experiment, reason)]) by model-state memory."""
    optimizer = optimizer if optimizer in OPTIMIZER_STATES else "adam"
    keep, pruned = [], []
    for exp in experiments:
        est = estimate(num_params, world_size, exp.stage, precision, exp.offload_optimizer,
                       exp.offload_param, optimizer=optimizer)
        if device_bytes is not None and est.device > device_bytes:
            pruned.append((exp, f"model states {human(est.device)} per rank > "
                                f"{human(device_bytes)} of device memory"))
        elif host_bytes is not None and est.cpu * ranks_per_host > host_bytes:
            pruned.append((exp, f"offloaded states {human(est.cpu * ranks_per_host)} per host > "
                                f"{human(host_bytes)} of host memory"))
        else:
            keep.append(exp)
    return keep, pruned
