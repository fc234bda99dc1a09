"""``dslaunch.runtime.config``, as ``deepspeed.runtime.config``: ``DeepSpeedConfig``, DeepSpeed's
config object as scripts build it themselves
(``DeepSpeedConfig(ds_config).train_batch_size``, ``MonitorMaster(DeepSpeedConfig(cfg)
.monitor_config)``). An adapter over the config room (``dslaunch/config``), as the monitor face
is over the engine's monitors: it holds no logic of its own.

The config is resolved once by dslaunch's config room, as the engine resolves it: for the
data-parallel size of this job (the mpu's data group, else the world over
``sequence_parallel_size``, else 1 outside a distributed job), so the batch triad is complete. The
attributes are DeepSpeed's most-read ones; ``typed`` holds every section (the engine's view) and
``_param_dict`` the dict as given. A bad config is dslaunch's ``ConfigError`` naming the key.
"""

from __future__ import annotations


class DeepSpeedConfig:
    def __init__(self, config, mpu=None, mesh_device=None):
        import torch.distributed as dist

        from dslaunch.config import load_config, resolve_config, to_dict

        self._param_dict = load_config(config)
        if dist.is_available() and dist.is_initialized():
            self.global_rank = dist.get_rank()
            if mpu is not None and hasattr(mpu, "get_data_parallel_world_size"):
                self.world_size = mpu.get_data_parallel_world_size()
            else:
                self.world_size = dist.get_world_size() // int(
                    self._param_dict.get("sequence_parallel_size") or 1)
        else:
            self.global_rank, self.world_size = 0, 1
        resolved = resolve_config(self._param_dict, dp_world_size=self.world_size,
                                  check_supported=False)
        t = self.typed = resolved.typed
        self.train_batch_size = t.train_batch_size
        self.train_micro_batch_size_per_gpu = t.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = t.gradient_accumulation_steps
        self.steps_per_print = t.steps_per_print
        self.wall_clock_breakdown = t.wall_clock_breakdown
        self.gradient_clipping = t.gradient_clipping
        self.zero_config = t.zero_optimization
        self.zero_optimization_stage = t.zero_optimization.stage
        self.zero_enabled = self.zero_optimization_stage > 0
        self.fp16_enabled = bool(t.fp16.enabled)
        self.bfloat16_enabled = bool(t.bf16.enabled)
        self.optimizer_name = t.optimizer.type.lower() if t.optimizer is not None else None
        self.optimizer_params = dict(t.optimizer.params) if t.optimizer is not None else None
        self.scheduler_name = t.scheduler.type if t.scheduler is not None else None
        self.scheduler_params = dict(t.scheduler.params) if t.scheduler is not None else None
        self.elasticity_enabled = bool(t.elasticity.enabled)
        self.pld_enabled = bool(t.progressive_layer_drop.enabled)
        for key, value in to_dict(t.eigenvalue).items():  # eigenvalue_enabled, eigenvalue_tol...
            setattr(self, f"eigenvalue_{key}", value)
        from dslaunch.monitor.config import DeepSpeedMonitorConfig

        self.monitor_config = DeepSpeedMonitorConfig(t)

    def print(self, name: str = "DeepSpeedConfig") -> None:
        import json

        from dslaunch.config import to_dict

        print(f"{name}:\n{json.dumps(to_dict(self.typed), indent=2, sort_keys=True, default=str)}")


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
