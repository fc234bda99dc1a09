"""A rank of bench_watchdog_cost.py: benchmarks/dslaunch_train.py, with the progress record off
when WATCHDOG_COST_OFF is set (the agent always names one; dropping it before dslaunch is
imported leaves ``progress_record.writer()`` None, as under torchrun). With it on, the rank
writes how many collectives it numbered per group to ``<out>/collectives<rank>.json``."""

import json
import os
import runpy
import sys

if os.environ.get("WATCHDOG_COST_OFF"):
    os.environ.pop("DSLAUNCH_PROGRESS_FILE", None)
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dslaunch_train.py")
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")

from dslaunch import progress_record  # noqa: E402

writer = progress_record.writer()
if writer is not None:
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(os.path.join(out, f"collectives{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump(writer._group_seq, f)
