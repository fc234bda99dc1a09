"""AutoTP checkpoints at other tensor-parallel sizes and as DeepSpeed universal checkpoints
(checkpoint/autotp_states.py, checkpoint/universal.py).

One 2-rank job (tests/scripts/autotp_reshape.py: a tiny Llama with 4 heads and 4 key/value
heads, so TP 1, 2 and 4 all divide them) trains 3 steps at TP 2 under ZeRO 0, 1 and 2, saves
and goes on 3 steps (the uninterrupted run). Its ZeRO 1 checkpoint is converted by
``dslaunch ckpt to-universal`` (whole tensors, DeepSpeed's AutoTP layout). Jobs at TP 4 (4
ranks), TP 2 and TP 1 load the native checkpoints, our universal folder and DeepSpeed 0.19.8's
own (tests/fixtures/autotp_universal: its AutoTP TP 2 + ZeRO 1 run on CPU, converted by its
ds_to_universal.py) from other initial weights and train the same 3 steps: the losses equal the
unsplit reference's (1e-5 relative; in practice within 1.2e-7) and DeepSpeed's (1e-6)."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dslaunch.cli import main as cli_main
from helpers import results

FIX_DIR = Path(__file__).resolve().parent / "fixtures" / "autotp_universal"
FIX = json.loads((FIX_DIR / "fixture.json").read_text())
DS_CKPT = FIX_DIR / "ckpt"


def _saved(job_cache):
    """The TP 2 job (its checkpoints under ckpt/, tags z0 z1 z2) and the universal folder of its
    ZeRO 1 checkpoint (made once)."""
    job = job_cache.run("autotp-reshape-save", "autotp_reshape.py", "--out", "{dir}/o", "--tp",
                        2, "--save", "{dir}/ckpt", nproc=2, timeout=240)
    assert job.ok, job.log[-4000:]
    uni = job.dir / "uni"
    if not (uni / "latest_universal").is_file():
        proc = CliRunner().invoke(cli_main, ["ckpt", "to-universal", str(job.dir / "ckpt"),
                                             str(uni), "--tag", "z1"])
        assert proc.exit_code == 0, proc.output
    return job, uni


def _loads(job_cache, tp, *loads):
    """A job at TP ``tp`` (tp ranks) running each ``name=stage:universal:dir[:tag]`` load."""
    src, uni = _saved(job_cache)
    fill = {"{ckpt}": str(src.dir / "ckpt"), "{uni}": str(uni), "{ds}": str(DS_CKPT)}
    args = []
    for spec in loads:
        for k, v in fill.items():
            spec = spec.replace(k, v)
        args += ["--load", spec]
    job = job_cache.run(f"autotp-reshape-tp{tp}", "autotp_reshape.py", "--out", "{dir}/o",
                        "--tp", tp, *args, nproc=tp, timeout=240)
    assert job.ok, job.log[-4000:]
    return results(job.dir / "o", tp)[0], results(src.dir / "o", 2)[0]


TP4 = ("z0=0:0:{ckpt}:z0", "z1=1:0:{ckpt}:z1", "z2=2:0:{ckpt}:z2", "u1=1:1:{uni}",
       "ds1=1:1:{ds}")
TP2 = ("u1=1:1:{uni}", "u0=0:1:{uni}", "ds1=1:1:{ds}", "ds2=2:1:{ds}")
TP1 = ("z1=1:0:{ckpt}:z1", "u1=1:1:{uni}", "u0=0:1:{uni}", "u2=2:1:{uni}", "ds1=1:1:{ds}",
       "ds0=0:1:{ds}")


def _check(run, name, want=None, rel=1e-5):
    assert "error" not in run, (name, run.get("error"), run.get("trace"))
    assert run["resumed_at"] == FIX["steps_before_save"], name
    for got, ref in zip(run["losses"], run["ref"], strict=True):
        assert abs(got - ref) <= 1e-5 * abs(ref), (name, run["losses"], run["ref"])
    if want is not None:
        for got, w in zip(run["losses"], want, strict=True):
            assert abs(got - w) <= rel * abs(w), (name, run["losses"], want)


def test_tp2_checkpoint_resumes_at_tp4(job_cache):
    """Native checkpoints: the TP 2 job's ZeRO 0, 1 and 2 checkpoints resume at TP 4 (each
    split weight and its states cut 4 ways from the 2 saved halves) with the uninterrupted
    run's next losses (TP 1: the next test)."""
    tp4, saved = _loads(job_cache, 4, *TP4)
    for stage in (0, 1, 2):
        _check(saved[f"z{stage}"] | {"resumed_at": 3}, f"saved z{stage}")
        _check(tp4[f"z{stage}"], f"z{stage} at TP 4", saved[f"z{stage}"]["losses"], 1e-6)


def test_to_universal_of_a_tp2_checkpoint_writes_whole_tensors_in_deepspeeds_layout(job_cache):
    """``dslaunch ckpt to-universal`` of the TP 2 ZeRO 1 checkpoint: every parameter whole
    (fp32 and Adam moments), ``cat_dim`` 0 for the column-split weights, 1 for the row-split
    ones, none for those every TP rank holds (as DeepSpeed's converter writes them), equal to
    the saved halves put together; one model-states file per TP rank with its slices and
    DeepSpeed's AutoTP universal_checkpoint_info."""
    src, uni = _saved(job_cache)
    out = uni / (uni / "latest_universal").read_text()
    assert out.name == "z1_universal"
    zero = out / "zero"
    q = torch.load(zero / "model.layers.0.self_attn.q_proj.weight" / "exp_avg.pt",
                   weights_only=True)
    o = torch.load(zero / "model.layers.1.mlp.down_proj.weight" / "fp32.pt", weights_only=True)
    norm = torch.load(zero / "model.norm.weight" / "exp_avg_sq.pt", weights_only=True)
    assert q["param"].shape == (32, 32) and q["cat_dim"] == 0
    assert o["param"].shape == (32, 64) and o["cat_dim"] == 1
    assert norm["param"].shape == (32,) and "cat_dim" not in norm
    assert float(torch.load(zero / "model.norm.weight" / "step.pt", weights_only=True)) == 3.0
    # the merged fp32 weights are the whole model the checkpoint saved
    whole = torch.load(src.dir / "ckpt" / "z1" / "model_states.pt", weights_only=False)["module"]
    assert torch.equal(o["param"], whole["model.layers.1.mlp.down_proj.weight"])
    models = [torch.load(out / f"mp_rank_0{t}_model_states.pt", weights_only=True)
              for t in (0, 1)]
    assert not (out / "mp_rank_02_model_states.pt").exists()
    for t, m in enumerate(models):
        assert (m["mp_world_size"], m["dp_world_size"], m["global_steps"]) == (2, 1, 3)
        assert torch.equal(m["module"]["model.layers.1.mlp.down_proj.weight"],
                           o["param"][:, 32 * t:32 * (t + 1)])
        info = m["universal_checkpoint_info"]
        assert info["universal_checkpoint_version"] == 0.4
        assert r"^model\.layers\.0\.self_attn\.o_proj\.weight$" in \
            info["parameter_with_row_parallelism_patterns"]
        assert r"^model\.norm\.weight$" in info["tp_replicated_parameter_patterns"]
        assert m["param_shapes"][0]["model.layers.0.self_attn.q_proj.weight"] == (16, 32)


def test_our_tp2_universal_checkpoint_loads_at_tp2_tp1_and_tp4(job_cache):
    """``load_universal`` of that folder at ZeRO 1 (and 0, 2) into TP 2, TP 1 and TP 4 jobs:
    the saving job's next losses; the native ZeRO 1 checkpoint resumes at TP 1 too."""
    tp1, saved = _loads(job_cache, 1, *TP1)
    want = saved["z1"]["losses"]
    _check(tp1["z1"], "native z1 at TP 1", want, 1e-6)
    for tp, names in ((2, ("u1", "u0")), (1, ("u1", "u0", "u2")), (4, ("u1",))):
        runs, _ = _loads(job_cache, tp, *{2: TP2, 1: TP1, 4: TP4}[tp])
        for name in names:
            _check(runs[name], f"{name} at TP {tp}", want, 1e-6)


def test_deepspeeds_autotp_universal_checkpoint_loads_with_its_losses(job_cache):
    """DeepSpeed 0.19.8's own universal checkpoint of its AutoTP TP 2 + ZeRO 1 run (its lm_head
    split by vocabulary too, an affine map per parameter) loads into dslaunch at TP 2 (ZeRO 1,
    2), TP 1 (ZeRO 1, 0) and TP 4: the losses DeepSpeed got going on after its save and after
    its own universal load at TP 2 and TP 1."""
    assert FIX["deepspeed"] == "0.19.8" and FIX["saved_tp"] == 2
    want = FIX["continued_losses"]
    for n in ("2", "1"):
        assert FIX["universal_losses"][n] == pytest.approx(want, rel=1e-6)
    for tp, names in ((2, ("ds1", "ds2")), (1, ("ds1", "ds0")), (4, ("ds1",))):
        runs, _ = _loads(job_cache, tp, *{2: TP2, 1: TP1, 4: TP4}[tp])
        for name in names:
            _check(runs[name], f"DeepSpeed's {name} at TP {tp}", want, 1e-6)
