"""Long-sequence training: Ulysses sequence parallelism (``ulysses.py``), the sequence axis of
the data pipeline and the loss (``sharding.py``), tiled compute (``tiled.py``)."""
