"""DeepSpeed's ``deepspeed.utils.zero_to_fp32`` calls (public in ``dslaunch.utils.zero_to_fp32``),
over ``consolidate.py``: a dslaunch checkpoint, either format, as one fp32 state_dict in memory, in
a file, or loaded into a model. (The standalone script written beside checkpoints is
``zero_to_fp32_script.py``.)

The names are those the checkpoint's model gives its tensors (a pipeline checkpoint's are the
unpartitioned ``PipelineModule``'s: ``N.param``, ``tied_modules.KEY.param``), buffers included.
"""

from __future__ import annotations

import os

import torch

from dslaunch.engine.checkpoint.consolidate import (
    check_output,
    fp32_state_dict,
    frozen_names,
    pipe_fp32_state_dict,
    save_state_file,
    to_fp32,
)
from dslaunch.engine.storage.pipe_files import is_pipe_checkpoint


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters: bool = False) -> dict:
    """The fp32 state_dict of the checkpoint ``tag`` (default: the one ``latest`` names) under
    ``checkpoint_dir``: fp32 masters where the job kept them (ZeRO 1-3; bf16/fp16 pipelines),
    the saved weights otherwise. ``exclude_frozen_parameters`` leaves out the parameters the job
    did not train."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    if is_pipe_checkpoint(checkpoint_dir, tag):
        state, _ = pipe_fp32_state_dict(checkpoint_dir, tag)
    else:
        state, _ = fp32_state_dict(checkpoint_dir, tag)
    if exclude_frozen_parameters:
        frozen = frozen_names(checkpoint_dir, tag)
        state = {k: v for k, v in state.items() if k not in frozen}
    return state


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size=None,
                                               safe_serialization: bool = False, tag=None,
                                               exclude_frozen_parameters: bool = False) -> str:
    """Write that state_dict (DeepSpeed's arguments, in DeepSpeed's order). ``output_dir`` is a
    directory when it exists as one, ends with a separator or ``max_shard_size`` is given:
    ``pytorch_model.bin`` (``model.safetensors`` with ``safe_serialization``) in it, or numbered
    shards of at most ``max_shard_size`` (default 5GB, as DeepSpeed) and their Hugging Face index
    json; otherwise it is the one file written. Returns the path written (the index when
    sharded). ``safe_serialization`` needs the safetensors package (a clear error without)."""
    check_output(max_shard_size, safe_serialization)
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not is_pipe_checkpoint(checkpoint_dir, tag):  # streamed to the output, never whole
        frozen = frozen_names(checkpoint_dir, tag) if exclude_frozen_parameters else ()
        return to_fp32(checkpoint_dir, output_dir, tag, max_shard_size, safe_serialization,
                       frozen)["path"]
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag,
                                                     exclude_frozen_parameters)
    return save_state_file(state, output_dir, max_shard_size, safe_serialization)


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir, tag=None):
    """Load the checkpoint's fp32 weights into ``model``, moved to the CPU first as DeepSpeed
    does (``strict=False``: names the model lacks are skipped); returns the model."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
