"""``deepspeed.profiling.flops_profiler.profiler``'s import path (scripts import the class from
it): the same names as ``dslaunch.profiling.flops_profiler``."""

from dslaunch.profiling.flops_profiler import *  # noqa: F403
from dslaunch.profiling.flops_profiler import __all__  # noqa: F401
