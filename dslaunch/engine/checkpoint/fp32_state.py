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

from .consolidate import fp32_state_dict, frozen_names, pipe_fp32_state_dict, save_state_file
from .pipeline import is_pipe_checkpoint

DEFAULT_FILE = "pytorch_model.bin"  # what DeepSpeed writes into an output directory


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


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None,
                                               exclude_frozen_parameters: bool = False,
                                               max_shard_size=None,
                                               safe_serialization: bool = False) -> str:
    """Write that state_dict to ``output_file``, or to ``pytorch_model.bin`` inside it when it is
    an existing directory (newer DeepSpeed takes an output directory there). One torch file
    whatever ``max_shard_size`` says; ``safe_serialization`` (safetensors) is not supported.
    Returns the path written."""
    if safe_serialization:
        raise ValueError("convert_zero_checkpoint_to_fp32_state_dict: safe_serialization is not "
                         "supported; dslaunch writes one torch file")
    out = os.fspath(output_file)
    if os.path.isdir(out):
        out = os.path.join(out, DEFAULT_FILE)
    save_state_file(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag,
                                                   exclude_frozen_parameters), out)
    return out


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir, tag=None):
    """Load the checkpoint's fp32 weights into ``model``, moved to the CPU first as DeepSpeed
    does (``strict=False``: names the model lacks are skipped); returns the model."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
