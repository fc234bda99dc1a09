"""Checkpoint files, below the engines that write and read them: rank files and metadata
(``files.py``), the ZeRO shards and their index, asynchronous writes, retention, RNG state, the
module state check, a pipeline checkpoint's file names, the standalone zero_to_fp32 script."""
