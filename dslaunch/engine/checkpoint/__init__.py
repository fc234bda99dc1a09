"""Checkpoints: everything that writes, reads or rewrites checkpoint files, in one room.

Modules (one idea each):
- ``files.py``: the contract on disk, shared by all: file names, ``CheckpointError``, atomic
  writes, ``torch.load(weights_only=True)`` reads, ``latest`` / tag resolution,
  ``metadata.json``, lazily mmap'd rank files (``RankFiles``).
- ``rng.py``: the RNG states a rank saves and restores.
- ``async_save.py``: ``save_checkpoint(async_save=True)``: host snapshot, background writer per
  rank, rank 0 publishes once every rank's ``.done`` marker is there (no collective off the
  main thread); ``wait_checkpoint``.
- ``retention.py``: ``keep_last``: older tags pruned after a publish, never ``latest``'s.
- ``save_load.py``: ``DSLaunchEngine.save_checkpoint`` / ``load_checkpoint`` (ZeRO 0-3, resharded
  on load when the layout differs) and ``save_16bit_model``.
- ``zero_shards.py``: what a ZeRO 1-3 strategy puts in its rank file and loads back, as saved or
  resharded from another layout (``load_resharded``).
- ``zero3_module.py``: ZeRO 3's weight-less ``model_states.pt``: placeholders written, and the
  weights read back from the shards (a stage-3 engine its own shard, others whole).
- ``shard_index.py``: where each parameter's elements sit in N ranks' shards (``ParamIndex``):
  the range arithmetic behind consolidation and reshaping.
- ``pipeline.py``: ``PipelineEngine`` checkpoints, one weights file per (stage, TP rank).
- ``consolidate.py``: ``dslaunch ckpt to-fp32``, either format -> one plain fp32 state_dict;
  ``load_consolidated`` (``dslaunch.pipe``). Streams: the ZeRO path is the script's
  ``zero_checkpoint`` (below); output as a torch file, safetensors, or Hugging Face shards.
- ``fp32_state.py``: DeepSpeed's ``zero_to_fp32`` calls over ``consolidate.py`` (public in
  ``dslaunch.utils.zero_to_fp32``).
- ``zero_to_fp32_script.py``: the template of ``<dir>/zero_to_fp32.py``, the same consolidation
  with torch alone (no dslaunch import), written beside the checkpoints on every save; its
  streaming ZeRO reader (one rank file mapped at a time, copied pages given back) and its output
  writer (``--safe_serialization``, ``--max_shard_size`` + index json) are what
  ``consolidate.py`` runs too, so there is one implementation.
- ``deepspeed_format.py``: DeepSpeed 0.19's own ZeRO 1-3 checkpoints, read by parameter name
  (``load_checkpoint`` of a DeepSpeed folder: weights, optimizer states, counters).
- ``universal.py``: DeepSpeed's universal checkpoint (``ds_to_universal.py``'s layout, one
  folder per parameter with whole tensors): loaded at any world size, ZeRO 0-3 (through
  ``deepspeed_format.py``'s loader), and written by ``dslaunch ckpt to-universal``.
- ``reshape.py``: ``dslaunch ckpt reshape``, a ZeRO 0-3 checkpoint rewritten offline for another
  world size. (The CLI itself is ``dslaunch/cli/ckpt.py``.)
- ``clone.py``: ``clone_tensors_for_torch_save`` (public in ``dslaunch.checkpoint.utils``).

Layout on disk, ``<dir>/<tag>/`` (tag default ``global_step{N}``; ``<dir>/latest`` names the
newest; ``<dir>/zero_to_fp32.py`` consolidates with torch alone):
- ZeRO 0-3 (``save_load.py``): ``model_states.pt`` (rank 0: weights, counters, scheduler, loss
  scaler, client_state), ``rank_{r}_optim_states.pt`` (every rank: strategy state, its ZeRO
  shard with layout metadata under ``strategy["zero"]``, RNG), ``metadata.json``. At ZeRO 3
  ``model_states.pt`` keeps empty placeholders of the partitioned weights, listed under
  ``zero3_partitioned`` (``zero3_module.py``): their values are the shards' masters, stored
  once, as DeepSpeed does (fp32 Adam: 12 bytes per parameter in all).
- Pipeline / TP (``pipeline.py``, format ``dslaunch-pipe-1``): one
  ``layer_stage{SS}_tp{TT}_model_states.pt`` per (stage, TP rank), ``rank_{r}_optim_states.pt``,
  ``engine_states.pt`` (rank 0: counters, scheduler, loss scaler, client_state),
  ``metadata.json`` (layout, and per (stage, TP rank) the TP splits and parameter names that
  consolidation needs).

Save: every rank writes into ``<dir>/.<tag>.tmp/``, each file under a temporary name, fsynced,
then renamed; once every rank's files are complete (a barrier; asynchronously, every rank's
marker) rank 0 renames the directory to ``<tag>`` and rewrites ``latest`` last, so a crash or a
rank killed at any moment leaves the previous checkpoint whole and ``latest`` naming it. Load:
``latest`` (or the tag) -> metadata -> weights checked against the model (the first mismatched
tensor is named) -> optimizer state -> counters, scheduler, loss scaler, RNG. Every file that
may come from someone else is read with ``torch.load(weights_only=True)``.

Another world size: ZeRO 1-3 rank files carry the layout of their shards, so a job laid out
otherwise reads each of its new shards' pieces from the old files (``zero_shards.py``
``load_resharded``, called by ``save_load.py``); ``reshape.py`` does the same offline, and
``consolidate.py`` gathers whole parameters. Stage 0's optimizer state is the same on every rank:
any rank's file serves. Pipeline checkpoints load only into the same layout; consolidate them.
"""
