"""The 2-rank MoE jobs of tests/test_moe_engine.py, test_moe_ragged.py and test_moe_autoep.py in
ONE launch (JobCache.run_many: torch, and transformers for AutoEP, imported once per rank for
all of them); whichever test asks first starts it, the others find their jobs cached.
``two_rank_job(job_cache, name)`` -> that run's Job (its own directory and log)."""

from __future__ import annotations

import importlib.util
import json

from helpers import ROOT

STEPS, SAVE_AT = 20, 10  # test_moe_engine's runs
ENGINE_TWO_ARGS = ("--out", "{dir}/out.json", "--runs", "1:1,2:0,2:1,2:2,2:0:resumed", "--steps",
                   STEPS, "--save-run", "2:0", "--save", "{dir}/ck", "--save-at", SAVE_AT,
                   "--load-run", "2:0:resumed", "--load", "{dir}/ck")
EXAMPLE = ROOT / "examples" / "train_moe_gpt.py"
EXAMPLE_ARGS = ("--experts", 4, "--ep", 2, "--steps", 4, "--log-every", 1, "--warmup", 1,
                "--n-layer", 2, "--d-model", 32, "--n-head", 2, "--seq-len", 16, "--json",
                "{dir}/out.json")
EXAMPLE_CONFIG = json.loads((ROOT / "configs" / "moe_gpt_zero1.json").read_text())

RUNS = {  # name: (args, config, script), in the order they run
    "moe_engine_2": (ENGINE_TWO_ARGS, None, "moe_engine_train.py"),
    "moe_example": (EXAMPLE_ARGS, EXAMPLE_CONFIG, EXAMPLE),
    "moe_ragged": (("--out", "{dir}/o"), None, "moe_ragged_ranks.py"),
}
if importlib.util.find_spec("transformers"):  # test_moe_autoep skips without it
    RUNS["autoep_ranks"] = (("--out", "{dir}/o"), None, "moe_autoep_ranks.py")
    RUNS["autoep_engine"] = (("--out", "{dir}/o"), None, "moe_autoep_engine.py")


def two_rank_job(job_cache, name):
    job_cache.run_many("moe_two_ranks", "moe_engine_train.py", RUNS, timeout=400)
    args, config, script = RUNS[name]
    return job_cache.run(name, script, *args, config=config, timeout=400)
