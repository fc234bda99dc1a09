"""Checkpoints: save/load, ZeRO shards, pipeline files, consolidation, reshaping."""
