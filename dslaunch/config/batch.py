"""The batch triad: train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * dp_size.

As in DeepSpeed: any two given, the third is inferred; only one of the two batch sizes given,
gradient_accumulation_steps is 1. Without a data-parallel size (``config validate`` with no
``--world-size``) the triad is checked as far as it can be and the value that depends on the
world size stays None, with a note that says so.
"""

from __future__ import annotations

from typing import Optional

TBS, MBS, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"
TRIAD = (TBS, MBS, GAS)


def resolve_batch(values: dict, sources: dict, problems: list, notes: list,
                  dp: Optional[int], world_size: Optional[int], frameworks_fill: bool = False) -> None:
    """Fill in the triad in ``values`` (in place); append problems and world-size notes.
    ``frameworks_fill``: both batch sizes "auto" is fine (a framework fills them; ``auto.py``)."""
    tbs, mbs, gas = (values[k] if isinstance(values[k], int) else None for k in TRIAD)
    was_auto = {k for k in TRIAD if values[k] == "auto"}

    def infer(key, value):
        values[key] = value
        sources[key] = "auto" if key in was_auto else "inferred"

    if tbs is None and mbs is None:
        if was_auto & {TBS, MBS} and frameworks_fill:
            return
        if was_auto & {TBS, MBS}:
            problems.append(f'{MBS}: "auto" cannot be resolved here (the Hugging Face Trainer fills '
                            f"it from per_device_train_batch_size); put the micro-batch size per "
                            f"GPU, a number, and {TBS} follows from it")
            return
        problems.append(f"{TBS}: missing; give {TBS} or {MBS} (with {GAS}, the third is "
                        f"inferred from the data-parallel size)")
        return
    size = _size_words(dp, world_size)

    if dp is None:
        _without_dp(tbs, mbs, gas, infer, problems, notes)
        return

    if tbs is not None and mbs is not None and gas is not None:
        if tbs != mbs * gas * dp:
            problems.append(f"{TBS}: inconsistent batch sizes: {TBS}={tbs} but {MBS}={mbs} * {GAS}="
                            f"{gas} * {size} = {mbs * gas * dp}; change one of the three")
    elif tbs is not None and mbs is not None:
        if tbs % (mbs * dp):
            problems.append(f"{TBS}: {tbs} is not divisible by {MBS}={mbs} * {size} = {mbs * dp}, "
                            f"so {GAS} cannot be inferred; change one of them")
        else:
            infer(GAS, tbs // (mbs * dp))
    elif tbs is not None and gas is not None:
        if tbs % (gas * dp):
            problems.append(f"{TBS}: {tbs} is not divisible by {GAS}={gas} * {size} = {gas * dp}, "
                            f"so {MBS} cannot be inferred; change one of them")
        else:
            infer(MBS, tbs // (gas * dp))
    elif mbs is not None and gas is not None:
        infer(TBS, mbs * gas * dp)
    elif tbs is not None:
        if tbs % dp:
            problems.append(f"{TBS}: {tbs} is not divisible by {size}, so {MBS} cannot be inferred "
                            f"(with {GAS}=1); give a multiple of {dp}")
        else:
            infer(GAS, 1)
            infer(MBS, tbs // dp)
    else:
        infer(GAS, 1)
        infer(TBS, mbs * dp)


def _without_dp(tbs, mbs, gas, infer, problems, notes) -> None:
    if tbs is not None and mbs is not None and gas is not None:
        if tbs % (mbs * gas):
            problems.append(f"{TBS}: {tbs} is not divisible by {MBS}={mbs} * {GAS}={gas} = "
                            f"{mbs * gas}; no world size makes these consistent")
        else:
            notes.append(f"{TBS}={tbs}, {MBS}={mbs}, {GAS}={gas} are consistent only for a "
                         f"data-parallel size of {tbs // (mbs * gas)}")
    elif tbs is not None and mbs is not None:
        if tbs % mbs:
            problems.append(f"{TBS}: {tbs} is not divisible by {MBS}={mbs}; no world size makes "
                            f"them consistent")
        else:
            notes.append(f"{GAS} depends on the world size: {tbs} / ({mbs} * data-parallel size)")
    elif tbs is not None and gas is not None:
        if tbs % gas:
            problems.append(f"{TBS}: {tbs} is not divisible by {GAS}={gas}; no world size makes "
                            f"them consistent")
        else:
            notes.append(f"{MBS} depends on the world size: {tbs} / ({gas} * data-parallel size)")
    elif mbs is not None and gas is not None:
        notes.append(f"{TBS} depends on the world size: {mbs} * {gas} * data-parallel size")
    elif tbs is not None:
        infer(GAS, 1)
        notes.append(f"{MBS} depends on the world size: {tbs} / data-parallel size ({GAS}=1)")
    else:
        infer(GAS, 1)
        notes.append(f"{TBS} depends on the world size: {mbs} * data-parallel size ({GAS}=1)")


def _size_words(dp: Optional[int], world_size: Optional[int]) -> str:
    if dp is None:
        return "data-parallel size"
    if world_size is None or world_size == dp:
        return f"world size {dp}"
    return f"data-parallel size {dp} (world size {world_size})"
