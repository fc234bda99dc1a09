"""What the Hugging Face Trainer / Accelerate path needed from dslaunch's DeepSpeed surface, each
gap pinned where it was fixed (the end-to-end proof is tests/test_hf_trainer.py):

- Accelerate writes ``steps_per_print: float("inf")`` (silences the periodic print): the config
  accepts Infinity there (and only there), and the engine then never prints;
- Transformers' ``prevent_arange_dtype_change`` (entered before every ZeRO-3 model build) patches
  and restores ``partition_parameters.zero_wrapper_for_fp_tensor_constructor`` and compares
  against ``_orig_torch_arange``: the names exist with DeepSpeed's meaning.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from dslaunch.config import ConfigError, resolve_config

BASE = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4}


def test_steps_per_print_accepts_infinity_only_there():
    cfg = resolve_config({**BASE, "steps_per_print": float("inf")}, world_size=1)
    assert cfg["steps_per_print"] == math.inf
    assert all(step % cfg["steps_per_print"] != 0 for step in (1, 10, 10**9))  # never prints
    with pytest.raises(ConfigError, match="steps_per_print: -Infinity is not allowed"):
        resolve_config({**BASE, "steps_per_print": float("-inf")}, world_size=1)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):  # other ints: no
        resolve_config({"train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": float("inf")}, world_size=1)


def test_partition_parameters_globals_that_transformers_patches():
    from transformers.integrations.deepspeed import prevent_arange_dtype_change

    from dslaunch.runtime.zero import partition_parameters as pp

    assert pp._orig_torch_arange is torch.arange
    wrap = pp.zero_wrapper_for_fp_tensor_constructor
    made = wrap(torch.zeros, torch.bfloat16)(2, 3)
    assert made.dtype == torch.bfloat16 and made.shape == (2, 3)
    assert made.device.type == pp.get_accelerator().device_name()
    assert wrap(torch.arange, torch.bfloat16, target_device="cpu")(5).dtype == torch.int64
    # Transformers' guard imports `deepspeed.runtime.zero.partition_parameters`: the alias's is ours
    from dslaunch import as_deepspeed

    if "deepspeed" in sys.modules:
        pytest.skip("a deepspeed module is already imported in this process")
    as_deepspeed.install(environ={"RANK": "1"})
    try:
        with prevent_arange_dtype_change():
            patched = pp.zero_wrapper_for_fp_tensor_constructor
            assert patched is not wrap
            # its wrapper spares torch.arange's dtype and keeps the others' behaviour
            arange = patched(torch.arange, torch.bfloat16, target_device="cpu")
            assert arange(0.0, 1.0, 0.5).dtype == torch.float32
            assert patched(torch.ones, torch.bfloat16)(2).dtype == torch.bfloat16
        assert pp.zero_wrapper_for_fp_tensor_constructor is wrap
    finally:
        as_deepspeed.uninstall()
