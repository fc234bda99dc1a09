"""``dslaunch.sequence``, as ``deepspeed.sequence``: long-sequence layers (``layer``: Ulysses)."""
