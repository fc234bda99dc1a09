"""Model-state memory per rank for ZeRO stages 0-3, with and without CPU / NVMe offload.

Pure arithmetic (no torch at import): the ZeRO paper's accounting, written as the bytes each rank
holds for parameters, gradients and optimizer states, on the accelerator ("device"), on the host
("cpu") and in NVMe swap files ("nvme"). Ψ = number of parameters, N = data-parallel ranks.

Bytes per parameter:
- ``fp32``:         params 4, grads 4, optimizer states 4·S (S = states per param: Adam 2). The
                    fp32 parameters are their own master copy.
- ``bf16``/``fp16``: params 2, grads 2, optimizer states 4 (fp32 master) + 4·S.

Stage 0 holds everything whole; stage 1 partitions optimizer states, stage 2 also gradients, stage 3
also parameters. Mixed precision + Adam gives the paper's 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N for stages
1-3. Stage 0 in mixed precision is 18Ψ here, not the paper's 16Ψ: the runtime (``stage0.py``)
accumulates gradients in one fp32 buffer (4Ψ) that the fp32 masters step from, so its gradients
cost 4 bytes per parameter whatever the model's dtype.

Offload (``offload_optimizer: cpu``): optimizer states and an fp32 gradient shard (what the CPU step
reads) live on the host; in fp32 the master is the parameters, so the host also keeps the fp32
parameter shard the step updates (4Ψ/N). ``offload_param: cpu`` (stage 3 only) moves the parameter
shard to the host.

NVMe (ZeRO-Infinity): ``offload_optimizer: nvme`` is CPU offload with the optimizer states
(4·S/N) and the fp32 master shard (4/N) moved from the host to the drive (``nvme/optimizer.py``
swaps both in around the step); the fp32 gradient shard stays on the host.
``offload_param: nvme`` (stage 3) moves the parameter shard to the drive instead of the host, and
always keeps an fp32 master (in fp32 without optimizer offload that is 4Ψ/N more on the device:
the optimizer steps the master, not the shard). The swap buffers are working buffers. Working
buffers (communication buckets, the gathered parameters of the modules
that are live in stage 3) are left out: they are bounded by the bucket/live-parameter knobs, not Ψ.

ZeRO++ hpZ (``zero_hpz_partition_size: h``, stage 3): every rank also keeps a secondary shard of
the parameters within its hpZ group, in the training dtype on the device: p·Ψ/h more (even with
``offload_param``: the secondary is what backward gathers from on the device). MiCS
(``mics_shard_size: s``, stage 3): parameters, gradients and optimizer states are partitioned
over the s ranks of a shard group, so N becomes s in the stage-3 formulas.

The engine's ``memory_breakdown()`` reports what the strategies really hold; the tests check that it
matches these formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

# optimizer -> fp32 states per parameter (besides the master copy)
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "lamb": 2, "sgd": 0, "sgd-momentum": 1, "adagrad": 1,
                    "lion": 1}
PRECISIONS = ("fp32", "bf16", "fp16")


OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _device(value, what: str) -> str:
    """True/False (CPU offload or none, the older spelling) or a device name."""
    if value is True or value is False:
        return "cpu" if value else "none"
    if value not in OFFLOAD_DEVICES:
        raise ValueError(f"{what} must be one of {OFFLOAD_DEVICES}, not {value!r}")
    return value


@dataclass(frozen=True)
class Estimate:
    stage: int
    offload_optimizer: str  # "none" | "cpu" | "nvme"
    offload_param: str
    params: dict  # {"device": bytes, "cpu": bytes, "nvme": bytes} per rank
    grads: dict
    optimizer: dict
    hpz: int = 1  # ZeRO++ secondary partition size (1: none)
    mics: int = -1  # MiCS shard size (-1: none)

    @property
    def device(self) -> int:
        return self.params["device"] + self.grads["device"] + self.optimizer["device"]

    @property
    def cpu(self) -> int:
        return self.params["cpu"] + self.grads["cpu"] + self.optimizer["cpu"]

    @property
    def nvme(self) -> int:
        return self.params["nvme"] + self.grads["nvme"] + self.optimizer["nvme"]

    def label(self) -> str:
        off = []
        if self.offload_optimizer != "none":
            off.append(f"offload_optimizer={self.offload_optimizer}")
        if self.offload_param != "none":
            off.append(f"offload_param={self.offload_param}")
        if self.hpz > 1:
            off.append(f"hpZ {self.hpz}")
        if self.mics > 0:
            off.append(f"MiCS {self.mics}")
        return f"stage {self.stage}" + (f" + {' + '.join(off)}" if off else "")

    def to_dict(self, ranks_per_host: int = 1) -> dict:
        return {
            "stage": self.stage,
            "hpz_partition_size": self.hpz, "mics_shard_size": self.mics,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
            "per_rank": {"device": self.device, "cpu": self.cpu, "nvme": self.nvme,
                         "params": self.params, "grads": self.grads,
                         "optimizer_states": self.optimizer},
            "per_host": {"device": self.device * ranks_per_host, "cpu": self.cpu * ranks_per_host,
                         "nvme": self.nvme * ranks_per_host},
        }


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def estimate(num_params: int, world_size: int, stage: int, precision: str = "bf16",
             offload_optimizer: bool | str = False, offload_param: bool | str = False,
             optimizer: str = "adam", hpz_partition_size: int = 1,
             mics_shard_size: int = -1) -> Estimate:
    """Bytes of model states one rank holds. Shards are rounded up as the runtime pads them.
    ``offload_*``: "none", "cpu", "nvme" (True / False: "cpu" / "none"); ``hpz_partition_size``,
    ``mics_shard_size``: ZeRO++ hpZ and MiCS (stage 3 only)."""
    offload_optimizer = _device(offload_optimizer, "offload_optimizer")
    offload_param = _device(offload_param, "offload_param")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0..3, not {stage}")
    if offload_optimizer != "none" and stage == 0:
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
    if offload_param != "none" and stage != 3:
        raise ValueError("offload_param needs ZeRO stage 3")
    opt = optimizer.lower()
    if opt not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, not {optimizer!r}")
    hpz = hpz_partition_size if hpz_partition_size > 1 else 1
    mics = mics_shard_size if mics_shard_size > 0 else -1
    if (hpz > 1 or mics > 0) and stage != 3:
        raise ValueError("hpz_partition_size and mics_shard_size need ZeRO stage 3")
    if mics > 0 and world_size % mics:
        raise ValueError(f"mics_shard_size {mics} does not divide the world size {world_size}")
    n, psi = (mics if mics > 0 else world_size), num_params
    shard = _ceil_div(psi, n)
    p = 4 if precision == "fp32" else 2
    mixed = p != 4
    states = 4 * OPTIMIZER_STATES[opt] + (4 if mixed else 0)  # fp32 bytes per param

    params_whole = p * (shard if stage == 3 else psi)
    # stage 0 accumulates into an fp32 gradient buffer in every precision (see the docstring)
    grads_whole = 4 * psi if stage == 0 else p * (shard if stage >= 2 else psi)
    opt_bytes = states * (psi if stage == 0 else shard)

    params = {"device": params_whole, "cpu": 0, "nvme": 0}
    grads = {"device": grads_whole, "cpu": 0, "nvme": 0}
    optim = {"device": opt_bytes, "cpu": 0, "nvme": 0}
    if offload_param == "nvme" and not mixed and offload_optimizer == "none":
        optim["device"] += 4 * shard  # the fp32 master the optimizer steps instead of the shard
    if offload_optimizer != "none":
        optim = {"device": 0, "cpu": opt_bytes + (0 if mixed else 4 * shard), "nvme": 0}
        if offload_optimizer == "nvme":  # the states and the fp32 master go to the drive
            optim = {"device": 0, "cpu": 0, "nvme": (4 * OPTIMIZER_STATES[opt] + 4) * shard}
        # the CPU step reads an fp32 gradient shard; from stage 2 on it replaces the device shard
        grads = {"device": grads_whole if stage < 2 else 0, "cpu": 4 * shard, "nvme": 0}
    if offload_param != "none":
        params = {"device": 0, "cpu": 0, "nvme": 0}
        params[offload_param] = params_whole
    if hpz > 1:  # the secondary shard, in the training dtype, on the device
        params["device"] += p * _ceil_div(psi, min(hpz, world_size))
    return Estimate(stage, offload_optimizer, offload_param, params, grads, optim, hpz, mics)


def all_estimates(num_params: int, world_size: int, precision: str = "bf16",
                  optimizer: str = "adam", hpz_partition_size: int = 1,
                  mics_shard_size: int = -1) -> list[Estimate]:
    """Every stage and offload choice, in the order the CLI prints them (the stage-3 rows with
    hpZ / MiCS when given)."""
    out = []
    for stage in range(4):
        choices = [("none", "none")]
        if stage >= 1:
            choices += [("cpu", "none")]
        if stage == 3:
            choices += [("cpu", "cpu")]
        if stage >= 1:
            choices += [("nvme", "none")]
        if stage == 3:
            choices += [("nvme", "nvme")]
        if stage == 3 and mics_shard_size > 0:
            choices = [c for c in choices if c[1] != "nvme"]  # not with parameters on NVMe
        extra = {"hpz_partition_size": hpz_partition_size,
                 "mics_shard_size": mics_shard_size} if stage == 3 else {}
        if extra and hpz_partition_size > 1:
            choices = [c for c in choices if c[1] != "nvme"]
        out += [estimate(num_params, world_size, stage, precision, o, p, optimizer=optimizer,
                         **extra) for o, p in choices]
    return out


def human(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"  # pragma: no cover
