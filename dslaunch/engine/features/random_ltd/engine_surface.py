"""The engine's side of random-LTD (DeepSpeed 0.19.8's ``random_ltd_*`` engine methods): the
scheduler made from the config, the layers bound to it, the kept length moved on every training
forward, the layer-token learning rate, and the checkpoint's ``random_ltd`` state."""

from __future__ import annotations

from dslaunch.config.random_ltd import lr_schedule_settings, random_ltd_section
from dslaunch.engine.features.random_ltd.convert import bind_layers, has_random_ltd_layers
from dslaunch.engine.features.random_ltd.lr_schedule import WarmupLayerTokenDecayLR
from dslaunch.engine.features.random_ltd.scheduler import RandomLTDScheduler


class RandomLTDSurface:
    """Mixed into the engine; needs ``config`` (the dict), ``module``, ``optimizer``,
    ``lr_scheduler``, ``train_batch_size()`` and ``train_micro_batch_size_per_gpu()``."""

    random_ltd_scheduler = None

    def random_ltd_config(self) -> dict:
        return random_ltd_section(self.config.get("data_efficiency"))

    def random_ltd_enabled(self) -> bool:
        return self.random_ltd_config().get("enabled") is True

    def _init_random_ltd(self) -> None:
        """At the end of ``__init__``: the scheduler (and the learning rate over layer tokens);
        layers the script wrapped before ``initialize`` are bound now."""
        if not self.random_ltd_enabled():
            return
        from dslaunch.engine.parallel.pipe.module import PipelineModule

        if isinstance(self.module, PipelineModule):  # train_batch never moves the kept length
            raise ValueError("data_efficiency.data_routing.random_ltd: not supported with a "
                             "PipelineModule (pipeline parallelism); train the model without "
                             "pipeline stages or disable random_ltd")
        config = dict(self.random_ltd_config(), global_batch_size=self.train_batch_size(),
                      micro_batch_size=self.train_micro_batch_size_per_gpu())
        self.random_ltd_scheduler = RandomLTDScheduler(config)
        lr = lr_schedule_settings(config)
        if lr is not None:
            if self.lr_scheduler is not None:
                raise ValueError("data_efficiency.data_routing.random_ltd.layer_token_lr_schedule"
                                 ": it is the learning-rate schedule; drop the config's "
                                 "\"scheduler\" section / lr_scheduler= or disable it")
            if not self._trains:
                raise ValueError("data_efficiency.data_routing.random_ltd.layer_token_lr_schedule"
                                 ": needs an optimizer")
            total, warmup, kind = lr
            self.lr_scheduler = WarmupLayerTokenDecayLR(self.optimizer, self.random_ltd_scheduler,
                                                        total, warmup, kind)
        if has_random_ltd_layers(self.module):
            self.random_ltd_initialize()

    def random_ltd_initialize(self) -> None:
        """Binds the wrapped layers ``random_ltd_layer_id`` names (``convert_to_random_ltd`` on
        the engine calls it)."""
        if self.random_ltd_scheduler is None:
            raise ValueError("convert_to_random_ltd: random-LTD is not enabled in the config "
                             "(data_efficiency.data_routing.random_ltd.enabled)")
        config = dict(self.random_ltd_config(), global_batch_size=self.train_batch_size(),
                      micro_batch_size=self.train_micro_batch_size_per_gpu())
        bind_layers(self.module, config, self.random_ltd_scheduler)

    def _random_ltd_forward(self) -> None:
        """Before a forward: a training one moves the kept length to this step's."""
        if self.random_ltd_scheduler is not None and self.module.training:
            self.random_ltd_scheduler.update_seq(self.global_steps)

    def _random_ltd_state(self):
        """The checkpoint's ``random_ltd`` entry (None when off, as DeepSpeed writes it)."""
        sched = self.random_ltd_scheduler
        return sched.state_dict() if sched is not None else None

    def _load_random_ltd_state(self, state) -> None:
        if self.random_ltd_scheduler is None or not state:
            return
        self.random_ltd_scheduler.load_state_dict(state)
        if isinstance(self.lr_scheduler, WarmupLayerTokenDecayLR):  # its tokens came back now
            self.lr_scheduler.step(self.lr_scheduler.last_batch_iteration)
