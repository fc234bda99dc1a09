"""The process grid (``topology.py``) and each parallel axis: the job's groups, tensor parallel
layers and plans, AutoTP, pipeline modules and schedules (``pipe/``), Ulysses sequence parallelism
(``sequence/``), experts and MoE (``moe/``)."""
