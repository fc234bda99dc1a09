"""Measuring a model's work: FLOPs counted at the ATen level (``counting.py``), DeepSpeed's
FLOPs profiler over it (``flops_profiler.py``), the device peaks MFU divides by (``peak.py``).
The public face is ``dslaunch.profiling`` (``deepspeed.profiling``)."""
