"""Rank script behind ``JobCache.run_many`` (tests/helpers.py): several runs of one rank script,
one after the other, in these same ranks, so that torch is imported once per rank for all of
them instead of once per run (~3 s of CPU per rank process on the test machine).

``--spec FILE``: a JSON list of {"name", "dir", "argv" (the script, then its arguments),
"config_path" (or null)}. For each run, in order:

- its config is validated for this world size and handed over as ``dslaunch run --config``
  hands it to the ranks (DSLAUNCH_CONFIG as written, DSLAUNCH_CONFIG_PATH);
- a marker line ``@@many_runs <name>`` goes to stdout and stderr (the cache cuts the job's log
  there, one log per run);
- the script runs as ``__main__`` with its own sys.argv (and what the launcher added after
  ``--spec``, such as ``--as-deepspeed``'s ``--local_rank=N``) and its directory first on sys.path (as
  ``python script`` runs it); ``dist.destroy_process_group()`` (which
  the scripts call at their end) is put off until after the last run, and ``sys.exit(0)`` ends
  only that run (so does clean_exit.exit_cleanly(), whose ``os._exit`` would end the ranks);
- every rank waits for the others, then rank 0 writes ``<dir>/.done``.

Under torchrun too (the reference jobs of tests/test_frameworks_ddp.py).

An exception in a run ends the job (the runs after it are not started).
"""

import argparse
import gc
import json
import os
import runpy
import sys

import clean_exit
import torch.distributed as dist

from dslaunch.cli.run import _config as validated_config

ap = argparse.ArgumentParser()
ap.add_argument("--spec", required=True)
opts, launcher_args = ap.parse_known_args()
spec = json.loads(open(opts.spec).read())

destroy = dist.destroy_process_group
dist.destroy_process_group = lambda *a, **k: None  # the scripts' own: after the last run
clean_exit.exit_cleanly = lambda: sys.exit(0)  # its os._exit would end the ranks, not the run
path0, argv0 = list(sys.path), list(sys.argv)
world = int(os.environ.get("WORLD_SIZE", "1"))
for run in spec:
    for stream in (sys.stdout, sys.stderr):
        print(f"@@many_runs {run['name']}", file=stream, flush=True)
    if run["config_path"]:
        os.environ["DSLAUNCH_CONFIG"] = validated_config(run["config_path"], world)
        os.environ["DSLAUNCH_CONFIG_PATH"] = run["config_path"]
    else:
        os.environ.pop("DSLAUNCH_CONFIG", None)
        os.environ.pop("DSLAUNCH_CONFIG_PATH", None)
    sys.argv = [*run["argv"], *launcher_args]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python script` sets it
    try:
        runpy.run_path(run["argv"][0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    sys.stdout.flush()
    sys.stderr.flush()
    sys.path[:], sys.argv = list(path0), list(argv0)
    gc.collect()  # the run's engine, model and optimizer states
    if dist.is_initialized():
        dist.barrier()
    if int(os.environ.get("RANK", "0")) == 0:
        open(os.path.join(run["dir"], ".done"), "w").close()
if dist.is_initialized():
    dist.barrier()
    destroy()
    if "DSLAUNCH_RESTART_COUNT" not in os.environ:  # not dslaunch's rank (torchrun's): leave as
        sys.stdout.flush()  # clean_exit does, past the interpreter's teardown (gloo's race)
        sys.stderr.flush()
        os._exit(0)
