"""``deepspeed.runtime.config.DeepSpeedConfig`` as scripts build it (DeepSpeed's monitor tutorial:
``MonitorMaster(DeepSpeedConfig(cfg).monitor_config)``; batch sizes read from it), through the
``--as-deepspeed`` alias's names: resolved by the config room, the batch triad completed, a bad
key refused by name."""

import json

import pytest

from dslaunch.config import ConfigError
from dslaunch.monitor.monitor import MonitorMaster
from dslaunch.runtime.config import DeepSpeedConfig


def test_deepspeed_config_reads_like_deepspeeds(tmp_path):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
           "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "run"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    for source in (cfg, str(path)):
        c = DeepSpeedConfig(source)
        assert (c.train_batch_size, c.train_micro_batch_size_per_gpu,
                c.gradient_accumulation_steps) == (8, 4, 2)  # one process: world 1
        assert (c.zero_optimization_stage, c.zero_enabled, c.bfloat16_enabled) == (2, True, True)
        assert (c.optimizer_name, c.optimizer_params["lr"]) == ("adamw", 1e-3)
    monitor = MonitorMaster(c.monitor_config)  # the monitor tutorial's line
    monitor.write_events([("Train/loss", 1.5, 1)])
    assert monitor.enabled and (tmp_path / "run").exists()


def test_bad_key_is_named():
    with pytest.raises(ConfigError, match="zero_optimisation: unknown key; did you mean"):
        DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {}})
