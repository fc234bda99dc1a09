"""What cannot recover in process, and why: the rank then exits ``REFUSED_EXIT`` and the launcher
restarts every rank (the reasons are the refusal lines the launcher prints)."""

from __future__ import annotations

from dslaunch.engine.recovery import pipe, tp


def unsupported(engine) -> str | None:
    """Why this engine cannot recover in process (None: it can)."""
    why = layout_refused(engine)
    if why is None and engine.zero_stage in (1, 2, 3) and not sharded(engine):
        what = "parameter and optimizer" if engine.zero_stage == 3 else "optimizer"
        why = (f"ZeRO stage {engine.zero_stage} here keeps no copy of each rank's {what} "
               f"shard ({shard_copies_refused(engine)})")
    return why


def layout_refused(engine) -> str | None:
    if pipe.pipe_grid(engine) is not None:  # a pipeline: PP x DP with DP >= 2
        why = pipe.refused(engine)
        if why:
            return why
    elif type(engine).__name__ != "DSLaunchEngine" or engine._dp_rank is not None:
        return "tensor and sequence parallel groups are not rebuilt in process"
    elif getattr(engine, "mpu", None) is not None:  # tensor parallel: only AutoTP's grid
        why = tp.refused(engine)
        if why:
            return why
    if engine.has_moe_layers:
        return "expert parallel groups are not rebuilt in process"
    if not engine._trains:
        return "a forward-only engine has no step to roll back to"
    return None


def shard_copies_refused(engine) -> str | None:
    """Why a ZeRO 1-3 engine keeps no copies of its shards (None: it can keep them)."""
    strategy = engine.strategy
    if offload_device(strategy.zero.offload_optimizer) == "nvme":
        return ("offload_optimizer keeps the optimizer states on NVMe, in files the copies do "
                "not read")
    if getattr(strategy, "experts", None):
        return "expert parallel groups are not rebuilt in process"
    return stage3_refused(strategy.zero) if strategy.stage == 3 else None


def offload_device(offload) -> str:
    """An offload section's device: "none", "cpu" or "nvme"."""
    return getattr(offload.device, "value", offload.device)


def stage3_refused(zero) -> str | None:
    if offload_device(zero.offload_param) == "nvme":
        # (offload_param to the CPU: the copies read and refill its host store)
        return "offload_param keeps the parameter shard on NVMe, in files the copies do not read"
    if zero.zero_hpz_partition_size > 1 or zero.mics_shard_size > 0:
        return "ZeRO++'s hpZ and MiCS groups are not rebuilt in process"
    if zero.zero_quantized_weights or zero.zero_quantized_gradients:
        return "ZeRO++'s quantized collectives are not rebuilt in process"
    return None


def sharded(engine) -> bool:
    return getattr(engine.strategy, "copies", None) is not None
