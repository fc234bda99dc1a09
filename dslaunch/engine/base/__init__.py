"""Leaves every layer of the engine may use: logging, precision and the loss scale, the step
policy, autocast, partition arithmetic, memory accounting, the fault injector, the repeating loader."""
