"""``deepspeed.monitor`` and ``deepspeed.elasticity`` as scripts call them.

- monitor: ``MonitorMaster(get_monitor_config(ds_config))`` writes a script's own events through
  the engine's CSV monitor (the files and columns the engine writes), nothing when no monitor is
  enabled; a bad section is the config's error naming the key; a missing package says so.
- elasticity: ``compute_elastic_config`` returns DeepSpeed's shapes with the batch and sizes the
  engine's own resolution picks for the same section, and DeepSpeed's errors for a missing /
  disabled section and an incompatible world size.
"""

from __future__ import annotations

import csv

import pytest

from dslaunch.config import ConfigError, resolve_config


def test_monitor_master_writes_csv_events(tmp_path):
    from dslaunch.monitor.config import get_monitor_config
    from dslaunch.monitor.csv_monitor import csvMonitor
    from dslaunch.monitor.monitor import Monitor, MonitorMaster

    cfg = {"train_batch_size": 8, "zero_optimization": {"stage": 2},
           "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "run1"}}
    mc = get_monitor_config(cfg)
    assert mc.enabled and mc.csv_monitor.enabled and not mc.tensorboard.enabled
    master = MonitorMaster(mc)
    assert isinstance(master, Monitor) and isinstance(master.csv_monitor, csvMonitor)
    assert master.tb_monitor is None and master.wandb_monitor is None
    master.write_events([("Train/Samples/train_loss", 1.5, 8), ("Train/Samples/lr", 0.1, 8)])
    master.write_events([("Train/Samples/train_loss", 1.25, 16)])
    with open(tmp_path / "run1" / "Train_Samples_train_loss.csv") as f:
        assert list(csv.reader(f)) == [["step", "train_loss"], ["8", "1.5"], ["16", "1.25"]]
    assert master.csv_monitor.log_dir == str(tmp_path / "run1")


def test_monitor_nothing_enabled_and_errors(tmp_path):
    from dslaunch.monitor.config import get_monitor_config
    from dslaunch.monitor.monitor import MonitorMaster

    master = MonitorMaster(get_monitor_config({"train_batch_size": 8}))
    assert not master.enabled and master.csv_monitor is None
    master.write_events([("x", 1.0, 1)])  # nothing to write to, no error
    with pytest.raises(ConfigError, match="csv_monitor.enabled"):
        get_monitor_config({"csv_monitor": {"enabled": "yes please"}})
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="pip install wandb"):
            MonitorMaster(get_monitor_config({"wandb": {"enabled": True}}))


ELASTIC = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
           "min_gpus": 1, "max_gpus": 10000, "version": 0.1}


def test_compute_elastic_config_matches_the_engines_resolution():
    import dslaunch as deepspeed
    from dslaunch.elasticity import compute_elastic_config

    batch, sizes = deepspeed.elasticity.compute_elastic_config({"elasticity": ELASTIC}, "0.19.8")
    # the largest highly composite multiple within 2000 that most sizes divide: 1680, 32 sizes
    assert batch == 1680 and len(sizes) == 32 and sizes[:4] == [1, 2, 3, 4] and sizes[-1] == 840
    batch4, sizes4, micro = compute_elastic_config({"elasticity": ELASTIC}, "0.19.8", world_size=4)
    resolved = resolve_config({"elasticity": ELASTIC}, world_size=4)
    assert (batch4, sizes4) == (batch, sizes)
    assert (batch4, micro) == (resolved["train_batch_size"],
                               resolved["train_micro_batch_size_per_gpu"])


def test_elasticity_errors():
    from dslaunch.elasticity import compute_elastic_config, elasticity_enabled
    from dslaunch.elasticity.config import ElasticityConfigError, ElasticityError, ElasticityIncompatibleWorldSize

    assert not elasticity_enabled({}) and elasticity_enabled({"elasticity": ELASTIC})
    with pytest.raises(ElasticityConfigError, match="missing"):
        compute_elastic_config({}, "0.19.8")
    with pytest.raises(ElasticityConfigError, match="enabled is false"):
        compute_elastic_config({"elasticity": {**ELASTIC, "enabled": False}}, "0.19.8")
    with pytest.raises(ElasticityConfigError, match="micro_batch_sizes"):
        compute_elastic_config({"elasticity": {"enabled": True, "max_train_batch_size": 8}}, "")
    with pytest.raises(ElasticityIncompatibleWorldSize) as err:
        compute_elastic_config({"elasticity": ELASTIC}, "0.19.8", world_size=9)
    assert isinstance(err.value, ElasticityError) and "9" in str(err.value)
