"""DeepSpeed's ``elasticity`` section (config/elasticity.py): the batch-size solver, the batch
triad it sets per world size, and the refusals (one line naming the key and the valid sizes).

Known answers are DeepSpeed's own (its unit tests and docs): max 10000, micro [8, 12, 16, 17],
gpus 32..1500 -> batch 9792 with 23 valid GPU counts; max 2000, micro [2, 4, 6] -> 1680.
"""

import pytest

from dslaunch.config import ConfigError, resolve_config
from dslaunch.config.elasticity import _highly_composite, elastic_sizes, solve_v01
from helpers import ROOT, dslaunch

SEC = {"enabled": True, "max_train_batch_size": 24, "micro_batch_sizes": [2, 4], "version": 0.1}


def _cfg(world_size=None, **over):
    return resolve_config({"elasticity": {**SEC, **over}}, world_size=world_size)


def test_highly_composite_numbers():
    assert _highly_composite(720720)[:14] == [1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720]
    assert len(_highly_composite(720720)) == 38 and _highly_composite(720720)[-1] == 720720


def test_deepspeed_known_answers():
    batch, sizes = solve_v01([8, 12, 16, 17], 10000, 32, 1500, True)
    assert batch == 9792 and len(sizes) == 23
    for n in sizes:  # every size splits the batch into a listed micro-batch with whole accumulation
        assert any(batch % (m * n) == 0 for m in (8, 12, 16, 17))
    assert solve_v01([2, 4, 6], 2000, 1, 10000, True)[0] == 1680


@pytest.mark.parametrize("world,micro,gas", [(1, 4, 6), (2, 4, 3), (3, 4, 2), (4, 2, 3), (6, 4, 1),
                                             (12, 2, 1)])
def test_batch_kept_constant_across_world_sizes(world, micro, gas):
    cfg = _cfg(world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
            cfg.gradient_accumulation_steps) == (24, micro, gas)
    assert cfg.sources["gradient_accumulation_steps"] == "inferred"


def test_world_size_the_solver_rules_out_is_refused_with_the_valid_sizes():
    with pytest.raises(ConfigError) as e:
        _cfg(5)
    (line,) = e.value.problems
    assert line.startswith("elasticity: data-parallel size 5 cannot keep the elastic batch")
    assert "[1, 2, 3, 4, 6, 12]" in line and "train_batch_size 24" in line
    with pytest.raises(ConfigError) as e:
        _cfg(6, max_gpus=4)
    assert "outside elasticity.min_gpus..max_gpus [1, 4]" in e.value.problems[0]


def test_without_world_size_the_batch_is_fixed_and_the_sizes_listed():
    cfg = _cfg()
    assert cfg.train_batch_size == 24 and cfg.train_micro_batch_size_per_gpu is None
    assert "valid data-parallel sizes for train_batch_size 24: [1, 2, 3, 4, 6, 12]" in cfg.notes[0]
    assert elastic_sizes(cfg.values) == [1, 2, 3, 4, 6, 12]


def test_written_batch_sizes_are_refused_unless_ignored():
    raw = {"train_batch_size": 8, "elasticity": SEC}
    with pytest.raises(ConfigError) as e:
        resolve_config(raw, world_size=2)
    assert e.value.problems[0].startswith("train_batch_size: set in the config, but elastic")
    assert "elasticity.ignore_non_elastic_batch_info" in e.value.problems[0]
    cfg = resolve_config({**raw, "elasticity": {**SEC, "ignore_non_elastic_batch_info": True}},
                         world_size=2)
    assert cfg.train_batch_size == 24


def test_section_errors_name_the_key():
    for over, start in [({"micro_batch_sizes": None}, "elasticity.micro_batch_sizes: missing"),
                        ({"micro_batch_sizes": [2, 0]}, "elasticity.micro_batch_sizes: [2, 0] is"),
                        ({"max_train_batch_size": None}, "elasticity.max_train_batch_size: missing"),
                        ({"micro_batch_sizes": [32]}, "elasticity.micro_batch_sizes: 32 is larger"),
                        ({"version": 0.3}, "elasticity.version:"),
                        ({"min_gpus": 4, "max_gpus": 2}, "elasticity.max_gpus: 2 is below"),
                        ({"max_batch": 3}, "elasticity.max_batch: unknown key")]:
        raw = {"elasticity": {k: v for k, v in {**SEC, **over}.items() if v is not None}}
        with pytest.raises(ConfigError) as e:
            resolve_config(raw, world_size=2)
        assert e.value.problems[0].startswith(start), (over, e.value.problems)


def test_version_02_counts_nodes_and_gives_other_sizes_their_own_batch():
    # 4 GPUs per node, model parallel 2: 2 data-parallel ranks per node
    cfg = _cfg(4, version=0.2, num_gpus_per_node=4, model_parallel_size=2, max_train_batch_size=48)
    assert cfg.train_batch_size == 48 and 48 % (4 * cfg.train_micro_batch_size_per_gpu) == 0
    assert elastic_sizes(cfg.values) == [2, 4, 6, 8, 12, 24]
    other = _cfg(5, version=0.2)  # not in the list: as DeepSpeed, a batch of its own
    assert other.train_batch_size == 20 and other.gradient_accumulation_steps == 1
    assert "not the elastic 24" in other.notes[0]


def test_shipped_config_and_cli_refusal(tmp_path):
    assert resolve_config(str(ROOT / "configs/elastic_zero2.json"), world_size=3).train_batch_size == 24
    out = dslaunch("config", "validate", "configs/elastic_zero2.json", "--world-size", "5")
    assert out.returncode == 1
    (line,) = (out.stdout + out.stderr).strip().splitlines()
    assert "elasticity: data-parallel size 5 cannot keep the elastic batch" in line
    assert "[1, 2, 3, 4, 6, 12]" in line
