"""DeepSpeed's data-efficiency data sampling, the engine's side: the memory-mapped index files
(``indexed_dataset``), the offline analyzer (``data_analyzer``), the curriculum sampler
(``data_sampler``) and their helpers (``utils``). The public face is
``dslaunch.runtime.data_pipeline.data_sampling`` (DeepSpeed's paths); the engine wires the sampler
in ``engine/features/data_sampling.py``."""
