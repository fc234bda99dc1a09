"""The engine's config, resolved once on the rank with the job's real layout (data-parallel size,
pipeline stages, tensor-parallel size): ``initialize`` builds the engine from it and in-process
recovery resolves it again when the world changes size."""

from __future__ import annotations

from dslaunch.config import resolve_config
from dslaunch.engine.base.log import log_dist
from dslaunch.engine.comm.membership import job_world_size
from dslaunch.engine.parallel.pipe.module import PipelineModule


def layout_sizes(model, mpu, batch_counts_tp=False):
    """(data-parallel size, pipeline stages or None, tensor-parallel size or None) of this job.
    ``batch_counts_tp``: AutoTP on the grid ``initialize`` built, whose batch triad counts the
    tensor-parallel ranks as DeepSpeed's does (``autotp.autotp_mpu``)."""
    if batch_counts_tp:
        tp = mpu.get_model_parallel_world_size()
        return mpu.get_data_parallel_world_size() * tp, None, tp

    if isinstance(model, PipelineModule):
        grid = model.grid
        return grid.dp_world_size, model.num_stages, grid.tp_world_size
    if mpu is not None:  # (DeepSpeed's sequence-parallel mpu has no tensor-parallel accessors)
        tp = getattr(mpu, "get_model_parallel_world_size", None)
        return mpu.get_data_parallel_world_size(), None, tp() if tp is not None else None
    return job_world_size(), None, None


def resolve_engine_config(source, model, mpu=None, origin=None):
    """The typed config of this rank (``dslaunch.config.sections``), resolved once with the
    job's real data-parallel size and parallel layout: a written batch size that does not fit
    it, or a ZeRO stage the layout cannot run, is a ``ConfigError`` naming the key."""
    return resolve(source, model, mpu, origin).typed


def resolve(source, model, mpu=None, origin=None, batch_counts_tp=False):
    dp, stages, tp = layout_sizes(model, mpu, batch_counts_tp)
    resolved = resolve_config(source, world_size=job_world_size(), dp_world_size=dp,
                              model_num_params=sum(p.numel() for p in model.parameters()),
                              pipeline_stages=stages, tensor_parallel_size=tp, origin=origin,
                              fills={"hidden_size": model_hidden_size(model)})
    for line in resolved.rewrites:  # dotted top-level keys (TRL's): say how they were read
        log_dist(f"config: {line}", ranks=[0])
    return resolved


def model_hidden_size(model):
    """The hidden size a Hugging Face-style model declares (``config.hidden_size``, the largest of
    ``hidden_sizes``, or its ``text_config``'s), which fills the ZeRO bucket sizes written "auto"
    as Transformers and Accelerate fill them; None for a model without one."""
    config = getattr(model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        size = getattr(cfg, "hidden_size", None)
        if isinstance(size, int) and size > 0:
            return size
        sizes = getattr(cfg, "hidden_sizes", None)
        if isinstance(sizes, (list, tuple)) and sizes and all(isinstance(x, int) for x in sizes):
            return max(sizes)
    return None
