"""ZeRO-Infinity: optimizer states, fp32 masters and stage 3 parameters kept on an NVMe drive.

- ``swap_dir.py``: the per-rank swap directory (made, locked, removed at exit or by the next job).
- ``swap_file.py``: what every swap file shares: 4 KiB-aligned ranges, one ``AsyncIOHandle`` from
  the ``aio`` section.
- ``optimizer.py``: ``NVMeSwappedOptimizer``, the optimizer states in a file, stepped sub-group by
  sub-group; ``masters.py``: its parameters (the fp32 master shard) in a second file.
- ``strategy.py``: ``with_nvme_swap``, how a ZeRO 1-3 strategy takes the NVMe path
  (``offload_optimizer: {device: nvme}``).
- ``param_store.py``: ``NVMeParamStore``, stage 3's parameter shard in a file
  (``offload_param: {device: nvme}``).

This package re-exports nothing: import a name from the module that holds it.
"""
