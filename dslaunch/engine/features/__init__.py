"""Training features the engine switches on from the config: data efficiency (sampling, routing,
variable batches), compression, sparse attention, random-LTD, curriculum, progressive layer drop,
eigenvalue, activation checkpointing."""
