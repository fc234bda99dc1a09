"""``dslaunch.profiling``, as ``deepspeed.profiling``: the FLOPs profiler (``flops_profiler/``)
and the device peaks MFU is measured against (``peak.py``)."""
