"""Every random number generator a rank draws from, saved in its rank file and restored on load
when the world size is unchanged (otherwise no file is this rank's own)."""

from __future__ import annotations

import random
import sys

import torch


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:  # only when the job uses numpy: never import it for this
        kind, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")),
                          "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        s = state["numpy"]
        np.random.set_state((s["kind"], s["keys"].numpy().astype(np.uint32), s["pos"],
                             s["has_gauss"], s["cached"]))
