"""``dslaunch.profiling``, as ``deepspeed.profiling``: the FLOPs profiler
(``dslaunch.profiling.flops_profiler``). A face: the implementation is ``dslaunch/engine/profiling/``."""
