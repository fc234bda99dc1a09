"""Measurements: monitors (CSV, TensorBoard, wandb, comet), FLOPs and the FLOPs profiler, peak
memory, the comms logger, the autotuning meter. Leaves: they import nothing of the engine."""
