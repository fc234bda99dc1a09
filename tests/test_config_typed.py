"""The typed config: frozen sections generated from the schema, resolved once per rank with the
job's real layout, and every refusal of an impossible combination made in one place
(``dslaunch.config``), before a rank starts where the file alone says enough."""

import dataclasses
import json
import subprocess

import pytest

from dslaunch.config import ConfigError, resolve_config, to_dict
from dslaunch.config.schema import TOP, Section
from helpers import DSLAUNCH, ROOT, launch


def _typed(extra=None, **kw):
    return resolve_config({"train_batch_size": 8, **(extra or {})}, **kw).typed


def _problems(raw, **kw):
    with pytest.raises(ConfigError) as info:
        resolve_config({"train_batch_size": 8, **raw}, **kw)
    return info.value.problems


# -- the typed sections -----------------------------------------------------------------------

def test_every_schema_key_is_a_typed_attribute_with_the_resolved_value():
    raw = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                 "reduce_bucket_size": 5e6},
           "aio": {"thread_count": 3}, "optimizer": {"type": "adamw", "params": {
               "lr": "1e-3", "betas": [0.9, 0.95]}},
           "tensor_parallel": {"my_key": 1}, "dslaunch": {"pipe_schedule": "gpipe"}}
    resolved = resolve_config({"train_micro_batch_size_per_gpu": 2, **raw}, world_size=4)
    cfg = resolved.typed

    def walk(section, spec, values):
        for name, sub in spec.fields.items():
            value = getattr(section, name)
            if isinstance(sub, Section) and sub.fill and value is not None:
                walk(value, sub, values[name])
            elif isinstance(sub, Section) or sub.kind in ("any", "floats"):
                assert to_dict(value) == values[name], name
            else:
                assert value == values[name] and (value is None or type(value).__name__ in
                                                  (sub.kind, "NoneType")), name

    walk(cfg, TOP, resolved.values)
    assert cfg.train_batch_size == 8 and cfg.gradient_accumulation_steps == 1  # inferred
    assert cfg.zero_optimization.reduce_bucket_size == 5_000_000  # 5e6 written: an int
    assert cfg.zero_optimization.offload_optimizer.device == "cpu"
    assert cfg.zero_optimization.overlap_comm is True  # our default for stage 2 (DeepSpeed: off)
    assert cfg.aio.intra_op_parallelism == 3  # DeepSpeed's older name, folded
    assert cfg.optimizer.type == "AdamW" and dict(cfg.optimizer.params) == {
        "lr": 1e-3, "betas": (0.9, 0.95)}
    assert dict(cfg.tensor_parallel.extra) == {"my_key": 1}
    assert cfg.dslaunch.pipe_schedule == "gpipe"
    assert cfg.scheduler is None


def test_sections_are_frozen_all_the_way_down():
    cfg = _typed({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.9]}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.zero_optimization.stage = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.zero_optimization.offload_optimizer.device = "cpu"
    with pytest.raises(TypeError):
        cfg.optimizer.params["lr"] = 1.0
    assert isinstance(cfg.optimizer.params["betas"], tuple)


def test_to_dict_gives_back_the_resolved_values():
    resolved = resolve_config({"train_batch_size": 8, "tensor_parallel": {"x": [1, 2]}},
                              world_size=2)
    assert to_dict(resolved.typed) == json.loads(resolved.to_json())


def test_pipe_schedule_is_checked_like_every_key():
    assert _problems({"dslaunch": {"pipe_schedule": "zigzag"}}) == [
        'dslaunch.pipe_schedule: "zigzag" is not allowed; expected one of \'1f1b\', \'gpipe\'']


# -- refusals, each in one place ----------------------------------------------------------------

def test_written_batch_size_must_fit_the_ranks_real_data_parallel_size():
    """The launcher saw 4 ranks and no pipeline.stages (data parallel 4: 16 = 2 x 2 x 4 fits);
    a rank of a 2-stage pipeline has data-parallel size 2, where 16 does not fit."""
    raw = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
           "gradient_accumulation_steps": 2}
    resolve_config(raw, world_size=4)  # the launcher's view: fine
    with pytest.raises(ConfigError) as info:
        resolve_config(raw, world_size=4, dp_world_size=2, pipeline_stages=2)
    assert info.value.problems == [
        "train_batch_size: inconsistent batch sizes: train_batch_size=16 but "
        "train_micro_batch_size_per_gpu=2 * gradient_accumulation_steps=2 * data-parallel size "
        "2 (world size 4) = 8; change one of the three"]


@pytest.mark.parametrize("raw, layout, problem", [
    ({"zero_optimization": {"stage": 2}, "pipeline": {"stages": 2}}, {},
     "zero_optimization.stage: 2 cannot be combined with pipeline parallelism"),
    ({"zero_optimization": {"stage": 2}}, {"pipeline_stages": 2},
     "zero_optimization.stage: 2 cannot be combined with pipeline parallelism"),
    ({"zero_optimization": {"stage": 3}}, {"tensor_parallel_size": 2},
     "zero_optimization.stage: 3 with the tensor parallelism of an mpu is not supported yet"),
    ({"pipeline": {"stages": 3}}, {"pipeline_stages": 2},
     "pipeline.stages: 3 but the PipelineModule has 2 stages"),
    ({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}}, {},
     "zero_optimization.stage: OneBitAdam works with ZeRO stage 0 only"),
    ({"optimizer": {"type": "ZeroOneAdam"},
      "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, {},
     'zero_optimization.offload_optimizer.device: "cpu" cannot be used with ZeroOneAdam'),
])
def test_impossible_combinations_are_refused_by_the_config(raw, layout, problem):
    problems = _problems(raw, world_size=8, **layout)
    assert [p for p in problems if p.startswith(problem)] == problems[:1], problems


def test_config_validate_refuses_what_the_file_alone_rules_out(tmp_path):
    """Before, these reached a rank and failed inside the engine; now `config validate` (and
    `dslaunch run`, before any rank starts) names the key."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 2},
                               "zero_optimization": {"stage": 2}}))
    r = subprocess.run([*DSLAUNCH, "config", "validate", str(cfg), "--world-size", "4"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0
    assert f"{cfg}: zero_optimization.stage: 2 cannot be combined with pipeline" in r.stderr + \
        r.stdout
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                               "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}},
                               "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}))
    r = subprocess.run([*DSLAUNCH, "config", "validate", str(cfg)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode != 0 and "offload_optimizer.device" in r.stderr + r.stdout


@pytest.mark.slow
def test_pipeline_job_refuses_a_batch_size_its_data_parallel_size_cannot_give(tmp_path):
    """4 ranks, a 2-stage PipelineModule, no pipeline.stages key: DeepSpeed refuses the file
    (16 != 2 x 2 x 2); before, dslaunch dropped the written 16 and trained at 8."""
    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
           "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    proc = launch(tmp_path, cfg, "pipe_train.py", ["--out", tmp_path / "o", "--pp", 2,
                                                  "--steps", 1], nproc=4, check=False,
                  timeout=240)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "train_batch_size: inconsistent batch sizes: train_batch_size=16" in out, out[-3000:]
    assert "data-parallel size 2 (world size 4) = 8" in out
    assert not (tmp_path / "o" / "rank_0.json").exists()
