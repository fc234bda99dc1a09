"""``dslaunch.runtime.data_pipeline.data_sampling``, as DeepSpeed's: curriculum data sampling.

- ``indexed_dataset``: the Megatron/DeepSpeed ``.bin``/``.idx`` memory-mapped array files;
- ``data_analyzer``: offline per-sample metrics (map over workers/threads, reduce into index files);
- ``data_sampler``: ``DeepSpeedDataSampler``, batches whose difficulty follows a curriculum;
- ``utils``: the small helpers the three share;
- ``variable_batch_size_and_lr``: dynamic batching (a library the script calls).
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules answer as attributes, as after import deepspeed
