"""``dslaunch ckpt to-fp32 | reshape | to-universal``: offline tools for checkpoints written by
the engine (the work is done in ``dslaunch/engine/checkpoint/``: ``consolidate.py``,
``reshape.py``, ``universal.py``)."""

from __future__ import annotations

import os

import click


@click.group("ckpt")
def ckpt():
    """Consolidate, reshape or convert dslaunch checkpoints."""


@ckpt.command("to-fp32")
@click.argument("ckpt_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path())
@click.option("--tag", "-t", default=None, help="Checkpoint tag (default: the one in 'latest').")
@click.option("--safe_serialization", "--safe-serialization", is_flag=True,
              help="Write safetensors (needs the safetensors package).")
@click.option("--max_shard_size", "--max-shard-size", default=None,
              help="Shard above this size (e.g. 5GB, 500MB) with a Hugging Face index json; "
                   "OUT is then a directory.")
def to_fp32_cmd(ckpt_dir, out, tag, safe_serialization, max_shard_size):
    """Write one plain fp32 state_dict (torch.load(weights_only=True) + model.load_state_dict).

    OUT is a file, or a directory when it exists as one, ends with '/' or --max_shard_size is
    given: pytorch_model.bin / model.safetensors in it, or numbered shards and their index json
    above the shard size (default 5GB), as DeepSpeed's zero_to_fp32.py writes."""
    from dslaunch.engine.checkpoint.consolidate import pipe_to_fp32, to_fp32
    from dslaunch.engine.storage.files import CheckpointError
    from dslaunch.engine.storage.pipe_files import is_pipe_checkpoint

    try:
        if is_pipe_checkpoint(ckpt_dir, tag):
            info = pipe_to_fp32(ckpt_dir, out, tag, max_shard_size, safe_serialization)
            click.echo(f"wrote {info['path']}: {info['tensors']} tensors, {info['bytes']:,} bytes "
                       f"({info['tp_merged']} merged from tensor-parallel slices, "
                       f"{info['tied']} tied copies written once); names are PipelineModule's "
                       "('N.param', 'tied_modules.KEY.param')")
            return
        info = to_fp32(ckpt_dir, out, tag, max_shard_size, safe_serialization)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {info['path']}: {info['tensors']} tensors, {info['bytes']:,} bytes "
               f"({info['params_from_shards']} rebuilt from ZeRO shards)")


@ckpt.command("reshape")
@click.argument("ckpt_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--world-size", type=click.IntRange(min=1), required=True,
              help="Data-parallel ranks of the job that will load it.")
@click.option("--tag", default=None, help="Checkpoint tag (default: the one in 'latest').")
def reshape_cmd(ckpt_dir, out_dir, world_size, tag):
    """Rewrite a ZeRO 0-3 checkpoint for another number of ranks (same losses on resume).

    Not needed to resume ZeRO 1-3 or stage 0 at another size: load_checkpoint reshards itself."""
    from dslaunch.engine.checkpoint.reshape import reshape
    from dslaunch.engine.storage.files import CheckpointError
    from dslaunch.engine.storage.pipe_files import is_pipe_checkpoint

    try:
        if is_pipe_checkpoint(ckpt_dir, tag):
            raise CheckpointError(f"{ckpt_dir}: a pipeline/tensor-parallel checkpoint cannot be "
                                  "reshaped (only ZeRO 0-3 ones): consolidate it with "
                                  "'dslaunch ckpt to-fp32' and load that file instead")
        dst = reshape(ckpt_dir, out_dir, world_size, tag)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {dst} for {world_size} ranks")


@ckpt.command("to-universal")
@click.argument("ckpt_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--tag", default=None, help="Checkpoint tag (default: the one in 'latest').")
@click.option("--out-tag", default=None,
              help="Tag of the folder written (default: TAG_universal).")
def to_universal_cmd(ckpt_dir, out_dir, tag, out_tag):
    """Write DeepSpeed's universal checkpoint (OUT_DIR/TAG_universal/zero/<param>/fp32.pt,
    exp_avg.pt, ... and OUT_DIR/latest_universal) from a ZeRO 1-3 checkpoint, dslaunch's or
    DeepSpeed's, an AutoTP one, or a pipeline-engine one (every parameter whole: TP slices
    merged, stages joined, PipelineModule's names 'N.param' and 'tied_modules.KEY.param', a tied
    parameter once). DeepSpeed loads it at any world size with "checkpoint": {"load_universal":
    true}; so does dslaunch, a pipeline job at any layout (pipeline stages, TP and data-parallel
    sizes, partition)."""
    from dslaunch.engine.checkpoint.universal import to_universal
    from dslaunch.engine.storage.files import CheckpointError

    try:
        dst, info = to_universal(ckpt_dir, out_dir, tag, out_tag)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {dst}: {info['params']} trained parameters with their optimizer states "
               f"and {info['others']} other tensors (ZeRO stage {info['stage']}, "
               + (f"{info['pipe']} pipeline stages x " if info.get("pipe", 1) > 1 else "")
               + f"{info['world_size']} ranks"
               + (f", tensor-parallel {info['tp_size']}: slices merged whole"
                  if info.get("tp_size", 1) > 1 else "")
               + f"); {os.path.join(out_dir, 'latest_universal')} names it")
