"""DeepSpeed's universal checkpoint, both ways (dslaunch/engine/checkpoint/universal.py).

The fixture (tests/fixtures/universal_ckpt/, made once by its make_fixture.py with DeepSpeed
0.19.8; DeepSpeed is not needed here) is what DeepSpeed's ds_to_universal.py wrote from a 2-rank
ZeRO 2 checkpoint of a tiny GPT after 3 Adam steps, with the losses DeepSpeed got on the next 3
global batches: continuing the 2-rank run, and after loading the universal folder with
``load_universal`` at world size 1 and 2. dslaunch loads it at world size 1 (another world
size; every ZeRO stage) and at 2 under stage 1, and must get DeepSpeed's losses. The other way,
``dslaunch ckpt to-universal`` of dslaunch's own 2-rank checkpoint loads back into dslaunch with
the losses the saving job went on to get (that DeepSpeed loads it too is checked by
benchmarks/universal_ckpt_peer.py, outside CI: it needs the DeepSpeed venv).
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from click.testing import CliRunner

import dslaunch
from dslaunch import checkpoint as ds_checkpoint
from dslaunch.cli import main as cli_main
from dslaunch.engine.storage.files import CheckpointError
from gpt import GPT, GPTConfig
from helpers import launch, results

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "universal_ckpt"
DS2 = Path(__file__).resolve().parent / "fixtures" / "deepspeed_ckpt" / "zero2"
FIX = json.loads((FIXTURE / "fixture.json").read_text())
REL = 1e-6


def dslaunch_cli(*args):
    """The CLI in this process (``dslaunch ckpt ...``): exit_code, output."""
    return CliRunner().invoke(cli_main, [str(a) for a in args])


def _config(stage, world=1, universal=True):
    cfg = dict(FIX["config"], train_micro_batch_size_per_gpu=FIX["config"]["train_batch_size"]
               // world, zero_optimization={"stage": stage})
    cfg["optimizer"] = {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.0}}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def _engine(stage, universal=True, model=None):
    torch.manual_seed(1)  # other initial weights than the checkpoint's: the load must set them
    engine, *_ = dslaunch.initialize(model=model or GPT(GPTConfig(**FIX["model"])),
                                     config=_config(stage, universal=universal))
    return engine


def _next_losses(engine, fix=FIX, steps=None):
    losses = []
    n = fix["steps_before_save"]
    for s in steps or range(n, len(fix["batches"])):
        tok, tgt = (torch.as_tensor(t) for t in fix["batches"][str(s)])
        loss = engine(tok, tgt)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeeds_universal_checkpoint_loads_at_another_world_size_with_its_losses(stage):
    assert FIX["deepspeed"] == "0.19.8" and FIX["saved_world_size"] == 2
    engine = _engine(stage)
    path, client = engine.load_checkpoint(FIXTURE / "ckpt")  # latest_universal names the tag
    assert Path(path).name == FIX["tag"] and client == {}
    assert engine.global_steps == FIX["steps_before_save"]
    got = _next_losses(engine)
    # DeepSpeed's own load of the same folder at world size 1, and its 2-rank run going on
    assert got == pytest.approx(FIX["universal_losses"]["1"], rel=REL), got
    assert got == pytest.approx(FIX["continued_losses"], rel=REL), got


def test_the_optimizer_state_matters_weights_alone_differ_after_the_first_step():
    """The oracle can fail: without the moments and step count the first loss is DeepSpeed's,
    the next ones are not."""
    engine = _engine(2)
    engine.load_checkpoint(FIXTURE / "ckpt", load_optimizer_states=False)
    got = _next_losses(engine)
    ref = FIX["universal_losses"]["1"]
    assert got[0] == pytest.approx(ref[0], rel=REL)
    assert abs(got[1] - ref[1]) > 1e-4


def test_deepspeeds_universal_checkpoint_in_a_2_rank_stage_1_job(tmp_path):
    launch(tmp_path, _config(1, world=2), "universal_train.py",
           ["--fixture", FIXTURE / "fixture.json", "--load", FIXTURE / "ckpt",
            "--out", tmp_path / "out"])
    got = [r["losses"] for r in results(tmp_path / "out", 2)]
    assert got[0] == got[1]
    assert got[0] == pytest.approx(FIX["universal_losses"]["2"], rel=REL)


def test_to_universal_of_a_dslaunch_checkpoint_round_trips(tmp_path):
    """A 2-rank ZeRO 2 job saves after 3 steps and goes on; ``dslaunch ckpt to-universal``
    converts its checkpoint, which loads at world size 1 (stages 1 and 3) with the losses the job
    got after its save."""
    launch(tmp_path, _config(2, world=2, universal=False), "universal_train.py",
           ["--fixture", FIXTURE / "fixture.json", "--save", tmp_path / "ckpt",
            "--out", tmp_path / "out"])
    saved = results(tmp_path / "out", 2)[0]["losses"]
    proc = dslaunch_cli("ckpt", "to-universal", tmp_path / "ckpt", tmp_path / "uni")
    assert proc.exit_code == 0, proc.output
    assert "17 trained parameters" in proc.output
    tag = (tmp_path / "uni" / "latest_universal").read_text()
    assert tag == "global_step3_universal"
    out = tmp_path / "uni" / tag
    # DeepSpeed's layout: one folder per parameter, whole tensors, DeepSpeed's keys
    fp32 = torch.load(out / "zero" / "tok_emb.weight" / "fp32.pt", weights_only=True)
    assert fp32["param"].shape == (64, 16) and fp32["cat_dim"] == 0
    step = torch.load(out / "zero" / "tok_emb.weight" / "step.pt", weights_only=True)
    assert step.dtype == torch.float32 and float(step) == 3.0
    optim = torch.load(out / "zero" / "optimizer_state.pt", weights_only=True)
    assert optim["ds_version"] == "0.19.8" and optim["param_groups"][0]["lr"] == 0.01
    assert float(optim["optimizer_state_dict"]["state"][0]["step"]) == 3.0  # DeepSpeed ZeRO 3's
    assert (out / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file()
    model = torch.load(out / "mp_rank_00_model_states.pt", weights_only=True)
    assert model["global_steps"] == 3 and model["dp_world_size"] == 2
    assert model[ds_checkpoint.UNIVERSAL_CHECKPOINT_INFO] == {
        ds_checkpoint.UNIVERSAL_CHECKPOINT_VERSION_KEY: 0.4}
    for stage in (1, 3):
        engine = _engine(stage)
        engine.load_checkpoint(tmp_path / "uni")
        got = _next_losses(engine)
        assert got == pytest.approx(saved, rel=REL), (stage, got, saved)


def test_to_universal_of_a_deepspeed_checkpoint_loads_with_deepspeeds_losses(tmp_path):
    """A DeepSpeed-format checkpoint converts without DeepSpeed (what ds_to_universal.py does)."""
    fix = json.loads((DS2 / "fixture.json").read_text())
    proc = dslaunch_cli("ckpt", "to-universal", DS2 / "ckpt", tmp_path / "uni", "--out-tag", "u")
    assert proc.exit_code == 0, proc.output
    torch.manual_seed(1)
    cfg = dict(fix["config"], train_batch_size=4, train_micro_batch_size_per_gpu=4,
               checkpoint={"load_universal": True})
    engine, *_ = dslaunch.initialize(model=GPT(GPTConfig(**fix["model"])), config=cfg)
    path, _ = engine.load_checkpoint(tmp_path / "uni")
    assert Path(path).name == "u"
    rows = {s: [torch.cat([torch.tensor(r[i]) for r in fix["batches"][str(s)]]) for i in (0, 1)]
            for s in (3, 4)}
    got = _next_losses(engine, {"steps_before_save": 3, "batches": {str(s): v for s, v in
                                                                     rows.items()}}, (3, 4))
    assert got == pytest.approx(fix["next_losses"], rel=1e-5, abs=1e-6)


def test_bad_universal_input_is_a_clear_error(tmp_path):
    uni = tmp_path / "uni"
    shutil.copytree(FIXTURE / "ckpt", uni)
    (uni / FIX["tag"] / "zero" / "head.weight" / "exp_avg.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"head.weight/exp_avg.pt: cannot read universal"):
        _engine(2).load_checkpoint(uni)
    other = GPT(GPTConfig(**dict(FIX["model"], d_model=32)))  # another model
    with pytest.raises(CheckpointError, match="tok_emb.weight.*shape"):
        _engine(2, model=other).load_checkpoint(FIXTURE / "ckpt")
    # a stage 0 checkpoint of dslaunch's: DeepSpeed loads universal ones into ZeRO 1-3 only
    eng = _engine(0, universal=False)
    eng.save_checkpoint(tmp_path / "s0")
    proc = dslaunch_cli("ckpt", "to-universal", tmp_path / "s0", tmp_path / "s0u")
    assert proc.exit_code != 0 and "ZeRO stage 0" in proc.output
    assert not (tmp_path / "s0u" / "latest_universal").exists()


def test_deepspeeds_constants_have_deepspeeds_values():
    assert ds_checkpoint.UNIVERSAL_CHECKPOINT_INFO == "universal_checkpoint_info"
    assert ds_checkpoint.UNIVERSAL_CHECKPOINT_VERSION_KEY == "universal_checkpoint_version"
    assert ds_checkpoint.UNIVERSAL_CHECKPOINT_VERSION_VALUE == 0.4
    assert ds_checkpoint.ORIGINAL_VOCAB_SIZE == "original_vocab_size"
    assert ds_checkpoint.PADDED_VOCAB_SIZE == "padded_vocab_size"
    assert ds_checkpoint.VOCABULARY_PARAMETER_PATTERNS == "vocabulary_parameter_patterns"
    assert ds_checkpoint.PIPELINE_REPLICATED_PARAMETER_PATTERNS == \
        "pipeline_replicated_parameter_patterns"
    assert ds_checkpoint.TP_REPLICATED_PARAMETER_PATTERNS == "tp_replicated_parameter_patterns"
    assert ds_checkpoint.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS == \
        "parameter_with_row_parallelism_patterns"
    assert ds_checkpoint.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0 == \
        "parameter_with_2_sub_params_cat_dim_0"
