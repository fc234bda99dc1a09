"""dslaunch's training runtime (one idea per module; see docs/interfaces.md, "Engine").

api.py (initialize, init_distributed, add_config_arguments) · engine.py (the loop, orchestration
only) · comm.py (process groups, collective accounting) · comm_api.py
(``dslaunch.comm``'s functions, booked there) · precision.py (bf16/fp16, loss scale) ·
zero/ (gradient reduction + optimizer step per ZeRO stage) · optim/ (optimizers, LR schedules) ·
onebit/ (1-bit Adam, 0/1 Adam, 1-bit LAMB, their compressed all-reduce and strategy) ·
checkpoint/ (save/load, consolidation, reshaping; map in its __init__) · monitor.py
(CSV/TensorBoard, wall clock) · memory.py (bytes held per kind) · log.py (the "dslaunch"
logger) · parallel_groups.py (the job's groups, for dslaunch.utils.groups) · dataloader.py
(RepeatingLoader).
"""
