"""Where a job's sequence-parallel size comes from, and the grid it runs on.

``sequence_parallel_size`` in the config (DeepSpeed's key) builds a ``pipe 1 x data x sequence x
model 1`` grid when ``initialize`` gets no ``mpu``; an ``mpu`` that answers
``get_sequence_parallel_world_size`` (``topology.build_grid(model=..., sequence=...)`` for
tensor x sequence parallelism, or the one ``UlyssesSPAttentionHF.register_with_transformers``
returns) is the layout itself, and the config must agree with it. The engine then averages the
weights' gradients (and ZeRO partitions its state) over the sequence x data plane, while the
batch triad counts data-parallel ranks only.
"""

from __future__ import annotations


def config_sequence_parallel_size(source) -> int:
    """The config's ``sequence_parallel_size`` (1 when absent; a bad value is left for the config
    validation to report)."""
    from dslaunch.config import load_config

    try:
        size = load_config(source).get("sequence_parallel_size", 1)
    except Exception:  # the config's own errors are reported by resolve_config, with key paths
        return 1
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else 1


def mpu_sequence_parallel_size(mpu) -> int:
    ask = getattr(mpu, "get_sequence_parallel_world_size", None)
    return int(ask()) if ask is not None else 1


def sequence_parallel_mpu(source, model, mpu):
    """The mpu ``initialize`` builds the engine with: ``mpu`` as given, or, for a config with
    ``sequence_parallel_size > 1`` and no mpu, the sequence x data grid."""
    size = config_sequence_parallel_size(source)
    if size == 1:
        return mpu
    from dslaunch.engine.parallel.pipe.module import PipelineModule

    if isinstance(model, PipelineModule):
        raise ValueError("sequence_parallel_size: not supported with a PipelineModule yet "
                         "(Ulysses runs with data, ZeRO 1-3 and tensor parallelism)")
    if mpu is None:
        from dslaunch.engine.parallel.topology import build_grid

        return build_grid(sequence=size)
    have = mpu_sequence_parallel_size(mpu)
    if have != size:
        raise ValueError(
            f"sequence_parallel_size: the config asks for {size} but the mpu's sequence-parallel "
            f"size is {have}; build the mpu with topology.build_grid(model=..., sequence={size}) "
            "or make the config agree")
    return mpu
