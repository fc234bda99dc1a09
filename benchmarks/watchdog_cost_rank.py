"""A rank of bench_watchdog_cost.py: benchmarks/dslaunch_train.py, with the progress record off
when WATCHDOG_COST_OFF is set (the agent always names one; dropping it before dslaunch is
imported leaves ``progress_record.writer()`` None, as under torchrun)."""

import os
import runpy
import sys

if os.environ.get("WATCHDOG_COST_OFF"):
    os.environ.pop("DSLAUNCH_PROGRESS_FILE", None)
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dslaunch_train.py")
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
