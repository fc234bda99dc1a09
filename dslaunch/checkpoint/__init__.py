"""``dslaunch.checkpoint``, as ``deepspeed.checkpoint``: ``utils.clone_tensors_for_torch_save`` and
the universal checkpoint's key names, DeepSpeed's values (``UNIVERSAL_CHECKPOINT_INFO``, ...).

A face: the checkpoint room is ``dslaunch/engine/checkpoint/`` (its ``__init__`` maps it; the
universal format is ``universal.py``).
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.engine.checkpoint.universal import (
    ORIGINAL_VOCAB_SIZE,
    PADDED_VOCAB_SIZE,
    PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0,
    PARAMETER_WITH_ROW_PARALLELISM_PATTERNS,
    PIPELINE_REPLICATED_PARAMETER_PATTERNS,
    TP_REPLICATED_PARAMETER_PATTERNS,
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    VOCABULARY_PARAMETER_PATTERNS,
)

from . import utils

__all__ = ["utils", "ORIGINAL_VOCAB_SIZE", "PADDED_VOCAB_SIZE",
           "PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0", "PARAMETER_WITH_ROW_PARALLELISM_PATTERNS",
           "PIPELINE_REPLICATED_PARAMETER_PATTERNS", "TP_REPLICATED_PARAMETER_PATTERNS",
           "UNIVERSAL_CHECKPOINT_INFO", "UNIVERSAL_CHECKPOINT_VERSION_KEY",
           "UNIVERSAL_CHECKPOINT_VERSION_VALUE", "VOCABULARY_PARAMETER_PATTERNS"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
