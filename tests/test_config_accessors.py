"""DeepSpeed's config accessors on the engine (dslaunch/engine/core/config_accessors.py):
``engine.gradient_clipping()``, ``engine.zero_reduce_bucket_size()``... Each answers the resolved
config: what the config says, else DeepSpeed 0.19.8's default (the same fixture the config
defaults are checked against, tests/test_config_defaults_vs_deepspeed.py)."""

import json
import sys
from pathlib import Path

import torch

from helpers import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import dslaunch
from dslaunch.config.schema import all_key_paths
from dslaunch.engine.core.config_accessors import ACCESSORS, DERIVED
from gpt import GPT, GPTConfig

DEFAULTS = json.loads((Path(__file__).parent / "fixtures" /
                       "config_defaults_ds0198.json").read_text())["defaults"]


def _engine(**config):
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    engine, *_ = dslaunch.initialize(model=model, config={"train_batch_size": 2, **config})
    return engine


def test_every_accessor_reads_a_key_of_the_schema():
    keys = set(all_key_paths())
    assert not [path for path in ACCESSORS.values() if path not in keys]
    assert not set(ACCESSORS) & set(DERIVED)


def test_an_engine_answers_deepspeeds_defaults():
    engine = _engine(optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    compared = 0
    for name, path in ACCESSORS.items():
        got = getattr(engine, name)()  # every accessor is a method, as DeepSpeed's
        if path in DEFAULTS:
            assert got == DEFAULTS[path], name
            compared += 1
    assert compared >= 30
    assert engine.gradient_clipping() == 1.0 and engine.steps_per_print() is None
    assert engine.zero_offload_optimizer() is None and engine.zero_offload_param() is None
    assert (engine.zero_cpu_offload(), engine.postscale_gradients(), engine.dynamic_loss_scale()) \
        == (False, True, True)
    assert engine.scheduler_name() is None and engine.optimizer_params() == {"lr": 1e-3}


def test_an_engine_answers_what_its_config_says():
    engine = _engine(optimizer={"type": "AdamW", "params": {"lr": 1e-3}},
                     gradient_clipping=0.5, steps_per_print=3, prescale_gradients=True,
                     scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
                     zero_optimization={"stage": 2, "reduce_bucket_size": 1234,
                                        "overlap_comm": False,
                                        "stage3_max_live_parameters": 77})
    assert (engine.gradient_clipping(), engine.steps_per_print()) == (0.5, 3)
    assert (engine.zero_reduce_bucket_size(), engine.zero_overlap_comm(),
            engine.zero_max_live_parameters()) == (1234, False, 77)
    assert engine.zero_optimization_partition_gradients()
    assert not engine.zero_optimization_partition_weights()
    assert not engine.postscale_gradients()
    assert engine.scheduler_name() == "WarmupLR"
    assert engine.scheduler_params()["warmup_num_steps"] == 4
