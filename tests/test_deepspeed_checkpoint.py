"""Checkpoints written by DeepSpeed 0.19.8 load into dslaunch's engine: a run moves over
mid-training with the same next-step losses.

The fixtures (tests/fixtures/deepspeed_ckpt/zero{1,2,3}/, made once by make_fixture.py with
DeepSpeed on 2 CPU ranks; DeepSpeed is not needed here) hold a tiny GPT's ZeRO 1, 2 and 3
checkpoint after 3 Adam steps and the loss DeepSpeed computed on each of the next two steps. In
one process (one rank: the 2-rank shards are read by parameter name), the engine loads the
checkpoint and trains on the same global batches: the first loss checks the weights, the second
the optimizer state (moments and step count) too. A 2-rank job does the same for stage 3 at the
world size it was saved with. Corrupt or mismatched checkpoints are clear errors.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dslaunch
from dslaunch.engine.storage.files import CheckpointError
from gpt import GPT, GPTConfig
from helpers import launch, results

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "deepspeed_ckpt"


def _fixture(stage):
    return json.loads((FIXTURES / f"zero{stage}" / "fixture.json").read_text())


def _engine(fix, stage=None, model=None):
    cfg = dict(fix["config"], train_batch_size=fix["config"]["train_micro_batch_size_per_gpu"]
               * fix["world_size"])
    cfg["train_micro_batch_size_per_gpu"] = cfg["train_batch_size"]  # one rank: the global batch
    if stage is not None:
        cfg["zero_optimization"] = {"stage": stage}
    torch.manual_seed(1)  # other initial weights than DeepSpeed's: the checkpoint must set them
    engine, *_ = dslaunch.initialize(model=model or GPT(GPTConfig(**fix["model"])), config=cfg)
    return engine


def _global_batch(fix, step):
    rows = fix["batches"][str(step)]
    return (torch.cat([torch.tensor(r[0]) for r in rows]),
            torch.cat([torch.tensor(r[1]) for r in rows]))


def _next_losses(engine, fix):
    losses = []
    for s in (fix["steps_before_save"], fix["steps_before_save"] + 1):
        loss = engine(*_global_batch(fix, s))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_checkpoint_resumes_with_deepspeeds_next_losses(stage):
    fix = _fixture(stage)
    assert fix["deepspeed"] == "0.19.8" and fix["world_size"] == 2
    engine = _engine(fix)
    path, client = engine.load_checkpoint(FIXTURES / f"zero{stage}" / "ckpt")
    assert Path(path).name == f"global_step{fix['steps_before_save']}" and client == {}
    assert engine.global_steps == fix["steps_before_save"]
    got = _next_losses(engine, fix)
    # first: the weights; second: one Adam step from the loaded moments and step count
    assert got == pytest.approx(fix["next_losses"], rel=1e-5, abs=1e-6), (got, fix["next_losses"])


def test_weights_only_without_the_optimizer_state_differ_on_the_second_step():
    """The oracle can fail: a fresh optimizer (load_optimizer_states=False) gives DeepSpeed's first
    loss but not its second."""
    fix = _fixture(2)
    engine = _engine(fix)
    engine.load_checkpoint(FIXTURES / "zero2" / "ckpt", load_optimizer_states=False)
    got = _next_losses(engine, fix)
    assert got[0] == pytest.approx(fix["next_losses"][0], rel=1e-5)
    assert abs(got[1] - fix["next_losses"][1]) > 1e-4


def test_a_stage_3_deepspeed_checkpoint_resumes_in_a_2_rank_stage_1_job(tmp_path):
    fix = _fixture(3)
    cfg = dict(fix["config"], train_batch_size=4, zero_optimization={"stage": 1})
    launch(tmp_path, cfg, "deepspeed_resume.py",
           ["--ckpt", FIXTURES / "zero3" / "ckpt", "--fixture", FIXTURES / "zero3" / "fixture.json",
            "--out", tmp_path / "out"])
    got = [r["losses"] for r in results(tmp_path / "out", 2)]
    assert got[0] == got[1]
    assert got[0] == pytest.approx(fix["next_losses"], rel=1e-5, abs=1e-6)


def _copy(tmp_path, stage):
    dst = tmp_path / f"zero{stage}"
    shutil.copytree(FIXTURES / f"zero{stage}" / "ckpt", dst)
    return dst, dst / "global_step3"


def test_corrupt_or_mismatched_deepspeed_checkpoints_are_clear_errors(tmp_path):
    fix = _fixture(2)
    ck, tag = _copy(tmp_path, 2)
    optim1 = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim1.write_bytes(optim1.read_bytes()[:500])  # truncated
    with pytest.raises(CheckpointError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt: cannot"):
        _engine(fix).load_checkpoint(ck)
    optim1.unlink()  # a rank's file missing: the count no longer fits
    with pytest.raises(CheckpointError, match="written by 2 ranks but 1 optimizer files"):
        _engine(fix).load_checkpoint(ck)
    ck3, tag3 = _copy(tmp_path, 3)
    (tag3 / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt: missing"):
        _engine(fix).load_checkpoint(ck3)
    other = GPT(GPTConfig(**dict(fix["model"], d_model=32)))  # another model
    with pytest.raises(CheckpointError, match="tok_emb.weight.*shape"):
        _engine(fix, model=other).load_checkpoint(FIXTURES / "zero2" / "ckpt")
    with pytest.raises(CheckpointError, match="stage 0.*load_optimizer_states=False"):
        _engine(fix, stage=0).load_checkpoint(FIXTURES / "zero2" / "ckpt")
