"""DeepSpeed's ``get_optim_files`` / ``get_model_state_file`` (``deepspeed.utils.zero_to_fp32``):
where a checkpoint keeps its optimizer states and its model states, for dslaunch's layout and for
DeepSpeed's own (``deepspeed_format.py``). Code that opens these files itself (Lightning's
``convert_zero_checkpoint_to_fp32_state_dict``) reads ``["optimizer_state_dict"]["zero_stage"]``
from the first optimizer file and the client state at the top level of the model-states file:
dslaunch's ``save_checkpoint`` writes both there, as DeepSpeed does (``save_load.py``).

Errors are DeepSpeed's: ``FileNotFoundError`` naming the folder or file.
"""

from __future__ import annotations

import glob
import os
import re

from dslaunch.engine.checkpoint.deepspeed_format import MODEL_3, MODEL_12
from dslaunch.engine.storage.files import model_file


def get_optim_files(checkpoint_dir) -> list:
    """The optimizer-state files of one checkpoint (``<dir>/<tag>``), in rank order."""
    checkpoint_dir = _existing_dir(checkpoint_dir)
    files = glob.glob(os.path.join(checkpoint_dir, "*_optim_states.pt"))
    if not files:
        raise FileNotFoundError(f"can't find '*_optim_states.pt' files in directory '{checkpoint_dir}'")
    return sorted(files, key=_rank_of)


def get_model_state_file(checkpoint_dir, zero_stage) -> str:
    """The model-states file of one checkpoint: dslaunch's ``model_states.pt``, or DeepSpeed's
    (``mp_rank_00_model_states.pt`` up to stage 2, rank 0's ``zero_pp_rank_0_...`` at stage 3)."""
    checkpoint_dir = _existing_dir(checkpoint_dir)
    path = model_file(checkpoint_dir)
    if not os.path.isfile(path):
        path = os.path.join(checkpoint_dir, MODEL_3.format(0) if int(zero_stage) == 3 else MODEL_12)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"can't find model states file at '{path}' (nor dslaunch's "
                                f"'{model_file(checkpoint_dir)}')")
    return path


def _existing_dir(checkpoint_dir) -> str:
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"Directory '{checkpoint_dir}' doesn't exist")
    return checkpoint_dir


def _rank_of(path: str):
    """rank_3_optim_states.pt / zero_pp_rank_3_mp_rank_00_optim_states.pt -> 3 (then the name:
    rank 10 after rank 9, where a plain sort puts it after rank 1)."""
    match = re.search(r"rank_(\d+)_", os.path.basename(path))
    return (int(match.group(1)) if match else -1, path)
