"""``dslaunch.runtime.sequence_parallel``, as ``deepspeed.runtime.sequence_parallel``."""
