"""The engines: the data-parallel engine (``engine.py``) and the pipeline engine (``pipe_engine.py``),
DeepSpeed's engine surface and config accessors, the engine's config resolved with the layout
(``engine_config.py``) and the seams where recovery is handed in (``recovery_seams.py``)."""
