"""``deepspeed.runtime.data_pipeline.data_routing.scheduler``: the kept-length schedule
(``dslaunch/engine/features/random_ltd/scheduler.py``) and dslaunch's layer-token learning-rate schedule
(``lr_schedule.py``; DeepSpeed refuses ``layer_token_lr_schedule``)."""

from dslaunch.engine.features.random_ltd.lr_schedule import WarmupLayerTokenDecayLR
from dslaunch.engine.features.random_ltd.scheduler import RandomLTDScheduler

BaseScheduler = RandomLTDScheduler  # DeepSpeed's base class holds the schedule of its one child

__all__ = ["BaseScheduler", "RandomLTDScheduler", "WarmupLayerTokenDecayLR"]
