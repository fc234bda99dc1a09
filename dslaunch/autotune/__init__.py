"""``dslaunch autotune``: find the fastest ZeRO stage x micro-batch x offload for a training script.

The pieces, one idea each:
- ``settings.py``: the config handed to the tuner: its ``autotuning`` section (DeepSpeed's keys
  and defaults, validated by the config schema) and the dimensions it tunes;
- ``space.py``: the experiments, and the pruning that needs no trial (batch bounds, the memory
  estimator of ``engine/zero/memory_estimate.py``);
- ``tuners.py``: which experiment runs next (gridsearch, random, model_based) and when to stop;
- ``trial.py``: one experiment as one ``dslaunch run`` job of the user's script, its result
  (ok / oom / failed / timeout) read from the metric file the engine writes
  (``engine/observe/autotuning_meter.py``) and from its log;
- ``results.py``: the results directory (every trial, resumable; the best config; the table);
- ``search.py``: the loop, with a rich progress display.

The tuner process only starts jobs: it never builds a model. ``cli/autotune.py`` imports this
package inside the command (the memory estimator's package, ``engine.zero``, brings torch), so
``dslaunch`` itself still starts without torch.
"""
