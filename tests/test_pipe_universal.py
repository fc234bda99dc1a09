"""Universal checkpoints of the pipeline engine (dslaunch/engine/checkpoint/pipe_universal.py):
``dslaunch ckpt to-universal`` of a pipeline checkpoint, and the universal folder loaded into a
PipelineEngine of another layout, continuing with the losses of the uninterrupted run.

The tiny GPT as PipelineModule layers (tests/scripts/pipe_model.py, pipe_train.py), AdamW, 4 steps,
saved after step 2. Sources, in one 2-rank launch: pipe 2 with the embedding tied to the head
(stage 0), pipe 1 x TP 2 with the vocabulary-parallel head (stage 0), and the same untied layers
as one plain nn.Sequential trained data-parallel with ZeRO 1 (tests/scripts/
pipe_universal_plain.py). Each is converted to universal here; the resumes run in a second 2-rank
launch at other layouts: steps 3 and 4 within 1e-5 relative of the saving job's (fp32; the
reductions are ordered differently), bit-identical at the saving layout. A model whose
parameters are not the checkpoint's is refused naming the first one missing, or the shape.
DeepSpeed 0.19.8's own pipeline universal checkpoint (tests/fixtures/pipe_universal, made by its
make_fixture.py with DeepSpeed's PipelineEngine on CPU and ds_to_universal.py) loads too and
continues with DeepSpeed's losses.

4 stages (a 4-rank launch, with 3 Blocks untied: 6 layers, so that "parameters" and "uniform"
cut 2 stages differently, [0, 2, 6] vs [0, 3, 6]; "parameters" cuts 4 stages [0, 1, 2, 3, 6]):
converted to universal (each stage's parameters once), resumed at 2 stages by either partition
method (the boundaries asserted from every rank's PipelineModule.parts), at 1 stage x DP 2
(ZeRO 1), and bit-identical at its own layout (a second 4-rank launch, which also resumes the
tied 2-stage source at 4 stages: the tied embedding on stages 0 and 3). Here all of these
continue bit-identically (0 difference); the tests allow REL.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dslaunch.cli import main as cli_main
from dslaunch.engine.checkpoint.universal import UniversalCheckpoint, to_universal
from dslaunch.engine.storage.files import CheckpointError

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
STEPS, SAVE_AT, REL = 4, 2, 1e-5


def _cfg(micro, gas, stage=0, universal=False):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, "zero_optimization": {"stage": stage},
            **({"checkpoint": {"load_universal": True}} if universal else {})}


def _train(*flags):
    return ("--out", "{dir}/o", "--steps", STEPS, *flags)


SAVE = ("--save-dir", "{dir}/ck", "--save-at", SAVE_AT)
SOURCES = {  # name: (args, config[, other rank script]); 2 ranks, global batch 4
    "pu_pp2_tied": (_train("--pp", 2, "--tied", *SAVE), _cfg(2, 2)),
    "pu_tp2_vocab": (_train("--tp", 2, "--vocab-parallel", *SAVE), _cfg(2, 2)),
    "pu_plain_zero1": (("--out", "{dir}/o", "--steps", STEPS, "--save-dir", "{dir}/ck",
                        "--save-at", SAVE_AT), _cfg(2, 1, stage=1), "pipe_universal_plain.py"),
}
PP4 = ("--pp", 4, "--blocks", 3)  # untied, 6 layers: "parameters" cuts [0, 1, 2, 3, 6]
SOURCES4 = {  # 4 ranks, global batch 4
    "pu_pp4": (_train(*PP4, *SAVE), _cfg(2, 2)),
}
RESUMES = {  # name: (source, pipe_train.py flags, config); the last one must fail
    "pu_same_layout": ("pu_pp2_tied", ("--pp", 2, "--tied"), _cfg(2, 2, universal=True)),
    "pu_to_tp2": ("pu_pp2_tied", ("--tp", 2, "--tied"), _cfg(2, 2, universal=True)),
    "pu_to_dp2_zero1": ("pu_pp2_tied", ("--tied",), _cfg(2, 1, stage=1, universal=True)),
    "pu_tp2_to_pp2": ("pu_tp2_vocab", ("--pp", 2), _cfg(2, 2, universal=True)),
    "pu_plain_to_pp2": ("pu_plain_zero1", ("--pp", 2), _cfg(2, 2, universal=True)),
    "pu_pp4_to_pp2": ("pu_pp4", ("--pp", 2, "--blocks", 3), _cfg(2, 2, universal=True)),
    "pu_pp4_to_pp2_uniform": ("pu_pp4", ("--pp", 2, "--blocks", 3, "--partition", "uniform"),
                              _cfg(2, 2, universal=True)),
    "pu_pp4_to_dp2_zero1": ("pu_pp4", ("--blocks", 3), _cfg(2, 1, stage=1, universal=True)),
    "pu_untied_from_tied": ("pu_pp2_tied", ("--pp", 2), _cfg(2, 2, universal=True)),
}
RESUMES4 = {  # the same, 4 ranks
    "pu_pp4_same_layout": ("pu_pp4", PP4, _cfg(2, 2, universal=True)),
    "pu_pp2_to_pp4": ("pu_pp2_tied", ("--pp", 4, "--tied"), _cfg(2, 2, universal=True)),
}


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pipe_universal"
DS_FIX = json.loads((FIXTURE / "fixture.json").read_text())
DS_RESUMES = {  # DeepSpeed's pipeline universal checkpoint into dslaunch: name -> flags
    "pu_ds_pp2": ("--pp", 2),
    "pu_ds_tp2": ("--tp", 2),
}


def _source(job_cache, name):
    sources, nproc = (SOURCES4, 4) if name in SOURCES4 else (SOURCES, 2)
    job_cache.run_many(f"pipe_universal_src{nproc}", "pipe_train.py", sources, nproc=nproc,
                       timeout=240)
    args, cfg, *other = sources[name]
    return job_cache.run(name, other[0] if other else "pipe_train.py", *args, config=cfg,
                         nproc=nproc, timeout=240)


def _universal(job_cache, name):
    """The source's checkpoint converted once per session (next to the jobs, not in them)."""
    job = _source(job_cache, name)
    out = job_cache.root / f"{name}-{job.key}-universal"
    if not (out / "latest_universal").is_file():
        to_universal(job.dir / "ck", out)
    return out


def _resume(job_cache, name):
    if name in RESUMES4:
        runs = {n: (_train("--load-dir", _universal(job_cache, src), *flags), cfg)
                for n, (src, flags, cfg) in RESUMES4.items()}
        job_cache.run_many("pipe_universal_resume4", "pipe_train.py", runs, nproc=4,
                           timeout=240)
        return job_cache.run(name, "pipe_train.py", *runs[name][0], config=runs[name][1],
                             nproc=4, timeout=240)
    runs = {n: (("--fixture", FIXTURE, "--out", "{dir}/o", *flags),
                _cfg(DS_FIX["micro"], DS_FIX["gas"], stage=1, universal=True),
                "pipe_universal_ds.py") for n, flags in DS_RESUMES.items()}
    runs.update({n: (_train("--load-dir", _universal(job_cache, src), *flags), cfg)
                 for n, (src, flags, cfg) in RESUMES.items()})  # the failing one last
    job_cache.run_many("pipe_universal_resume", "pipe_train.py", runs, nproc=2, timeout=240)
    args, cfg, *other = runs[name]
    return job_cache.run(name, other[0] if other else "pipe_train.py", *args, config=cfg,
                         nproc=2, timeout=240, check=name != "pu_untied_from_tied")


def _losses(job):
    ranks = job.results(sub="o")
    assert len({tuple(r["losses"]) for r in ranks}) == 1  # every stage reports the same
    return ranks[0]["losses"]


def _assert_continues(job_cache, resume, exact=False):
    src, _, _ = {**RESUMES, **RESUMES4}[resume]
    want = _losses(_source(job_cache, src))[SAVE_AT:]
    job = _resume(job_cache, resume)
    for r in job.results(sub="o"):
        assert r["start"] == SAVE_AT and r["client_state"] == {"step": SAVE_AT}
    got = _losses(job)
    assert len(got) == len(want) == STEPS - SAVE_AT
    if exact:
        assert got == want, (got, want)
    for g, w in zip(got, want):
        assert abs(g - w) <= REL * abs(w), (resume, got, want)
    return got, want


def test_to_universal_joins_stages_and_writes_tied_weights_once(job_cache):
    """Every parameter of both stages under PipelineModule's names, the tied embedding once,
    each with its fp32 master, both Adam moments and the step; the fp32 values are the
    consolidated weights (dslaunch ckpt to-fp32's)."""
    from dslaunch.engine.checkpoint.consolidate import pipe_fp32_state_dict

    job = _source(job_cache, "pu_pp2_tied")
    out = _universal(job_cache, "pu_pp2_tied")
    folder = out / (out / "latest_universal").read_text()
    names = sorted(os.listdir(folder / "zero"))
    assert "tied_modules.embed.tok_emb.weight" in names and "1.block.ln1.weight" in names
    assert not any(n.startswith("0.") or n.startswith("4.") for n in names)  # tied layers
    whole, _ = pipe_fp32_state_dict(job.dir / "ck")
    uc = UniversalCheckpoint(str(folder))
    assert set(uc.where) == set(whole)
    for name, t in whole.items():
        assert torch.equal(uc.full(name), t), name
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert (folder / "zero" / name / f"{key}.pt").is_file(), (name, key)
    assert float(torch.load(folder / "zero" / "1.block.ln1.weight" / "step.pt")) == SAVE_AT


def test_to_universal_merges_tp_slices_cli(job_cache, tmp_path):
    """`dslaunch ckpt to-universal` of the TP 2 checkpoint: split parameters whole, with the
    split's dim as cat_dim, the ones every TP rank holds without; DeepSpeed's AutoTP
    model-states files, one per TP rank."""
    job = _source(job_cache, "pu_tp2_vocab")
    res = CliRunner().invoke(cli_main, ["ckpt", "to-universal", str(job.dir / "ck"),
                                        str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "tensor-parallel 2: slices merged whole" in res.output
    folder = tmp_path / "global_step2_universal"
    head = torch.load(folder / "zero" / "4.head.weight" / "fp32.pt", weights_only=True)
    assert head["param"].shape == (256, 32) and head["cat_dim"] == 0  # vocab-parallel rows
    proj = torch.load(folder / "zero" / "1.block.attn.proj.weight" / "exp_avg.pt",
                      weights_only=True)
    assert proj["param"].shape == (32, 32) and proj["cat_dim"] == 1  # row-parallel
    ln = torch.load(folder / "zero" / "1.block.ln1.weight" / "fp32.pt", weights_only=True)
    assert "cat_dim" not in ln
    assert (folder / "mp_rank_01_model_states.pt").is_file()
    meta = json.loads((job.dir / "ck" / "global_step2" / "metadata.json").read_text())
    assert (meta["pipe"], meta["tp"]) == (1, 2)


def test_same_layout_resume_is_bit_identical(job_cache):
    _assert_continues(job_cache, "pu_same_layout", exact=True)


def test_pipe2_to_tp2(job_cache):
    """2 stages x TP 1 -> 1 stage x TP 2 (each TP rank cuts its slices of the whole tensors)."""
    _assert_continues(job_cache, "pu_to_tp2")


def test_pipe2_to_one_stage_dp2_zero1(job_cache):
    """2 stages, ZeRO 0 -> 1 stage x 2 data-parallel ranks, ZeRO 1 (each cuts its shard)."""
    _assert_continues(job_cache, "pu_to_dp2_zero1")


def test_tp2_vocab_parallel_to_pipe2(job_cache):
    """1 stage x TP 2 (vocabulary-parallel head) -> 2 stages x TP 1."""
    _assert_continues(job_cache, "pu_tp2_to_pp2")


def test_plain_zero1_run_loads_into_pipeline(job_cache):
    """A ZeRO 1 run of the same layers as one nn.Sequential ('N.<param>', PipelineModule's names
    for untied layers): its universal folder loads into a 2-stage pipeline and continues."""
    _assert_continues(job_cache, "pu_plain_to_pp2")


def test_model_without_the_checkpoint_parameters_is_refused(job_cache):
    """The untied model (head '4.head.weight', embedding '0.tok_emb.weight') from the tied
    checkpoint: a CheckpointError naming the missing parameter."""
    job = _resume(job_cache, "pu_untied_from_tied")
    assert not job.ok
    assert "is not in the universal checkpoint" in job.log
    assert "'0.tok_emb.weight'" in job.log or "'4.head.weight'" in job.log


def test_shape_mismatch_is_refused(job_cache):
    """A stage whose parameter is another size: a CheckpointError naming the file and both
    shapes (the stage reader, on a plain module holding the same names)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    from pipe_model import layer_list, reference_model

    from dslaunch.engine.checkpoint.pipe_universal import StageView
    from gpt import GPTConfig

    out = _universal(job_cache, "pu_tp2_vocab")
    uc = UniversalCheckpoint(str(out / (out / "latest_universal").read_text()))
    _, mods = reference_model(layer_list(GPTConfig(seq_len=16, n_layer=2, d_model=48,
                                                   n_head=2)), 0)
    module = torch.nn.Sequential(*mods)
    module.stage_id = 0
    with pytest.raises(CheckpointError, match=r"zero/0\.tok_emb\.weight/fp32\.pt: parameter "
                                              r"'0\.tok_emb\.weight' has shape \[256, 32\] in the "
                                              r"checkpoint but \[256, 48\]"):
        StageView(uc, module, {})


@pytest.mark.parametrize("name", sorted(DS_RESUMES))
def test_deepspeed_pipeline_universal_checkpoint_loads(job_cache, name):
    """DeepSpeed 0.19.8's own: its PipelineModule (2 stages, ZeRO 1) checkpoint through its
    ds_to_universal.py (tests/fixtures/pipe_universal) loads into dslaunch at 2 stages and at
    1 stage x TP 2, and continues with DeepSpeed's losses (both its uninterrupted run's and its
    own universal resume's) within 1e-5 relative."""
    job = _resume(job_cache, name)
    for r in job.results(sub="o"):
        assert r["start"] == DS_FIX["steps_before_save"]
        for want in (DS_FIX["continued_losses"], DS_FIX["universal_losses"]):
            assert len(r["losses"]) == len(want)
            for g, w in zip(r["losses"], want):
                assert abs(g - w) <= REL * abs(w), (name, r["losses"], want)


def test_tied_layer_found_under_a_plain_models_name(job_cache):
    """A tied layer's tensor missing as 'tied_modules.<key>.<param>' is read from
    '<first index of key>.<param>', where a plain model of the same layer list holds it (here
    the untied TP 2 run's universal folder read by a one-stage tied PipelineModule)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    from pipe_model import layer_list, loss_fn, pipe_specs

    from dslaunch.engine.checkpoint.autotp_states import whole_shapes
    from dslaunch.engine.checkpoint.pipe_universal import StageView
    from dslaunch.pipe import PipelineModule

    out = _universal(job_cache, "pu_tp2_vocab")
    uc = UniversalCheckpoint(str(out / (out / "latest_universal").read_text()))
    module = PipelineModule(pipe_specs(layer_list(tied=True)), num_stages=1, loss_fn=loss_fn)
    view = StageView(uc, module, whole_shapes(module))
    assert view.name_of["tied_modules.embed.tok_emb.weight"] == "0.tok_emb.weight"
    sd = view.module_state_dict()
    assert torch.equal(sd["tied_modules.embed.tok_emb.weight"], uc.full("0.tok_emb.weight"))
    assert torch.equal(sd["1.block.ln1.weight"], uc.full("1.block.ln1.weight"))


def test_pipe4_to_universal_holds_every_stage(job_cache):
    """4 stages (untied, 3 Blocks: layers [0], [1], [2], [3, 4, 5] by "parameters"): the
    universal folder holds each stage's parameters once, the consolidated fp32 values."""
    from dslaunch.engine.checkpoint.consolidate import pipe_fp32_state_dict

    job = _source(job_cache, "pu_pp4")
    assert [r["parts"] for r in job.results(sub="o")] == [[0, 1, 2, 3, 6]] * 4
    out = _universal(job_cache, "pu_pp4")
    uc = UniversalCheckpoint(str(out / (out / "latest_universal").read_text()))
    whole, _ = pipe_fp32_state_dict(job.dir / "ck")
    assert set(uc.where) == set(whole)
    assert {n.split(".")[0] for n in whole} == {"0", "1", "2", "3", "4", "5"}
    for name, t in whole.items():
        assert torch.equal(uc.full(name), t), name


@pytest.mark.parametrize("resume,parts", [("pu_pp4_to_pp2", [0, 2, 6]),
                                          ("pu_pp4_to_pp2_uniform", [0, 3, 6])])
def test_pipe4_to_pipe2_either_partition(job_cache, resume, parts):
    """4 stages -> 2, cut by "parameters" (the source's method: Embed + Block | the rest) and by
    "uniform" (3 layers each: the second Block moves to stage 0); the boundaries are the
    engines' own (PipelineModule.parts of every rank)."""
    _assert_continues(job_cache, resume)
    assert [r["parts"] for r in _resume(job_cache, resume).results(sub="o")] == [parts] * 2


def test_pipe4_to_one_stage_dp2_zero1(job_cache):
    """4 stages, ZeRO 0 -> 1 stage x 2 data-parallel ranks, ZeRO 1."""
    _assert_continues(job_cache, "pu_pp4_to_dp2_zero1")


def test_pipe4_same_layout_resume_is_bit_identical(job_cache):
    _assert_continues(job_cache, "pu_pp4_same_layout", exact=True)


def test_pipe2_tied_to_pipe4(job_cache):
    """2 stages (embedding tied to the head) -> 4 stages: the tied layer now on stages 0 and 3,
    both loading 'tied_modules.embed.tok_emb.weight'."""
    _assert_continues(job_cache, "pu_pp2_to_pp4")
    ranks = _resume(job_cache, "pu_pp2_to_pp4").results(sub="o")
    assert [r["parts"] for r in ranks] == [[0, 1, 2, 3, 5]] * 4
