"""dslaunch's training runtime, in layers (docs/architecture.md, "The engine's layers"; a
module imports only its own package or lower layers: tests/test_import_rules.py).

Bottom up: base/ (log, precision, step policy, partition arithmetic, fault injection) and
observe/ (monitors, FLOPs, profiling, the comms logger) · comm/ (process groups, collectives and
their accounting, DeepSpeed's ``deepspeed.comm`` functions, host groups, membership) · optim/
(optimizers, 1-bit ones included, LR schedules) and parallel/ (the grid, tensor / AutoTP,
pipeline modules, sequence, experts and MoE) · storage/ (checkpoint files) and features/ (data
efficiency, compression, sparse attention, random-LTD, curriculum, PLD, eigenvalue, activation
checkpointing) · zero/ (ZeRO 0-3, offload, NVMe) · checkpoint/ (save / load, consolidation,
reshaping, formats) · core/ (the engines, DeepSpeed's engine surface, the recovery seams) ·
recovery/ (in-process recovery, handed to the engine) · api.py (``initialize``).
"""
