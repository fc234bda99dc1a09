"""Process groups and every collective the runtime makes, with their accounting (``collectives.py``),
DeepSpeed's ``deepspeed.comm`` functions (``api.py``), the gloo paths (``pairwise.py``,
``hierarchical.py``), the groups by host (``host_groups.py``) and who this process is in the job
(``membership.py``: a standby, a replacement, a lost peer)."""
