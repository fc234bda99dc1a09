"""ZeRO stage 3 checkpoints loaded with another world size, and across stages 1-3.

Real gloo jobs through `dslaunch run` (tests/scripts/zero_train.py, the tiny GPT of
examples/gpt.py, global batch 16 whatever the world size):

- a: stage 3, fp32, 2 ranks, 12 steps, saves at step 6 (the reference: its steps 6-11 are what an
  unreshaped resume gives, bit for bit, see test_zero_train.py::test_resume_is_bit_identical);
- r4: 4 ranks, stage 3 with offload_optimizer + offload_param cpu, loads a's checkpoint
  (resharded automatically by load_checkpoint), saves at step 9;
- r1: that checkpoint rewritten for 1 rank by `dslaunch ckpt reshape`, resumed on 1 rank;
- b: stage 3, bf16, offload_optimizer + offload_param cpu, 2 ranks, saves at step 6;
  rb: a 1-rank stage 2 bf16 job (no offload) resumes it.

Launches: a and b in one (JobCache.run_many), r4 its own, r1 and rb (1 rank each) in one, r1
first; rb runs alone when its test runs without the first.

Tolerances. fp32: 1e-5 relative per step (the issue's bound). Another world size splits the
global batch into other micro-batches and sums the gradients in another order, so gradients differ
by fp32 rounding (~1e-7 relative); Adam carries that forward (observed ~2e-7). bf16: 2e-3 relative,
one bf16 rounding step (8 mantissa bits): gradients are held and reduce-scattered in bf16, so
another world size rounds the partial sums differently, by up to about one bf16 ulp per value.
The optimizer state itself is moved exactly: the exactness checks below compare fp32 masters, Adam
moments and step counts bit for bit, read back from the files.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, dslaunch

SCRIPT = "zero_train.py"
STEPS, SAVE_AT, RESAVE_AT = 12, 6, 9
pytestmark = pytest.mark.slow


def _config(stage, precision="fp32", offload=False, persist=False):
    z = {"stage": stage, "reduce_bucket_size": 20000}
    if stage == 3 and not persist:  # partition every parameter (the default keeps this model whole)
        z["stage3_param_persistence_threshold"] = 0
    if offload:
        z["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            z["offload_param"] = {"device": "cpu"}
    c = {"train_batch_size": 16, "gradient_accumulation_steps": 2,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
         "gradient_clipping": 0.5, "steps_per_print": 1000, "zero_optimization": z}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    return c


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """This file's own scratch directory (reshaped and re-saved checkpoints): never a job's."""
    return tmp_path_factory.mktemp("reshape")


def _job(job_cache, name: str, nproc: int, config: dict, *args):
    """A 12-step job of tests/scripts/zero_train.py, run once per session; ``{dir}`` in args is
    the job's own directory (``{dir}/ck``: the checkpoint it saves)."""
    return job_cache.run(name, SCRIPT, "--steps", STEPS, "--out", "{dir}/out.json", *args,
                         config=config, nproc=nproc, timeout=240)


def _launch(job_cache, name: str, nproc: int, config: dict, *args) -> dict:
    return _job(job_cache, name, nproc, config, *args).json()["losses"]


def _ckpt(*args) -> str:
    p = dslaunch("ckpt", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


SOURCES = {  # the two source jobs, 2 ranks, each saving at step 6 into {dir}/ck
    "a": _config(3),  # stage 3, fp32
    "b": _config(3, "bf16", offload=True),  # stage 3, bf16, offload
}


def _source(job_cache, name):
    """Source job ``name``; the first asked for starts both in one launch (JobCache.run_many)."""
    args = ("--steps", STEPS, "--out", "{dir}/out.json", "--save", "{dir}/ck", "--save-at", SAVE_AT)
    job_cache.run_many("reshape_src", SCRIPT, {n: (args, c) for n, c in SOURCES.items()},
                       timeout=240)
    return _job(job_cache, name, 2, SOURCES[name], "--save", "{dir}/ck", "--save-at", SAVE_AT)


def _one_rank_resumes(job_cache, work):
    """r1 (loads ``work/ck_r1``, made by the first test) and rb (loads b's checkpoint) in one
    1-rank launch, r1 first (a failed run ends the launch: rb's failure cannot hide r1's)."""
    def args(ck):
        return ("--steps", STEPS, "--out", "{dir}/out.json", "--load", ck)
    job_cache.run_many("reshape_1rank", SCRIPT, {
        "r1": (args(work / "ck_r1"), _config(3)),
        "rb": (args(ck_b(job_cache)), _config(2, "bf16"))}, nproc=1, timeout=240)


def _job_a(job_cache):
    return _source(job_cache, "a")


def _job_b(job_cache):
    return _source(job_cache, "b")


def run_a(job_cache):
    return _job_a(job_cache).json()["losses"]


def run_b(job_cache):
    return _job_b(job_cache).json()["losses"]


def ck_a(job_cache) -> Path:
    return _job_a(job_cache).dir / "ck"


def ck_b(job_cache) -> Path:
    return _job_b(job_cache).dir / "ck"


def _max_rel(ref, got):
    assert got and set(got) <= set(ref)
    return max(abs(ref[k] - got[k]) / abs(ref[k]) for k in got)


def _meta(ckpt_dir: Path) -> dict:
    tag = (ckpt_dir / "latest").read_text().strip()
    return json.loads((ckpt_dir / tag / "metadata.json").read_text())


def test_stage3_2_to_4_to_1_ranks_continues_with_the_same_losses(job_cache, work):
    full = run_a(job_cache)
    assert full[STEPS - 1] < full[0] - 0.3  # it trains
    job4 = _job(job_cache, "r4", 4, _config(3, offload=True), "--load", ck_a(job_cache),
                "--save", "{dir}/ck", "--save-at", RESAVE_AT)
    r4, ck_r4 = job4.json()["losses"], job4.dir / "ck"
    assert _meta(ck_r4)["world_size"] == 4
    _ckpt("reshape", ck_r4, work / "ck_r1", "--world-size", 1)
    assert _meta(work / "ck_r1")["world_size"] == 1
    _one_rank_resumes(job_cache, work)
    r1 = _launch(job_cache, "r1", 1, _config(3), "--load", work / "ck_r1")
    assert sorted(r4) == list(range(SAVE_AT, STEPS)) and sorted(r1) == list(range(RESAVE_AT, STEPS))
    assert _max_rel(full, r4) <= 1e-5
    assert _max_rel(full, r1) <= 1e-5
    # the 1-rank checkpoint consolidates to the very weights of the 4-rank one it was made from
    from dslaunch.engine.checkpoint.consolidate import to_fp32

    _ckpt("to-fp32", work / "ck_r1", work / "r1.pt")
    to_fp32(ck_r4, work / "r4.pt")
    a, b = (torch.load(work / f, weights_only=True) for f in ("r4.pt", "r1.pt"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_stage3_bf16_offload_checkpoint_continues_in_stage2_on_one_rank(job_cache):
    full = run_b(job_cache)
    rb = _launch(job_cache, "rb", 1, _config(2, "bf16"), "--load", ck_b(job_cache))
    assert sorted(rb) == list(range(SAVE_AT, STEPS))
    assert _max_rel(full, rb) <= 2e-3


# -- exactness, read back from the files -----------------------------------------------------------

def _optimizer_state(ckpt_dir: Path) -> dict:
    """Every parameter's fp32 master and optimizer states, and each group's scalars (step),
    reassembled from the rank files: {(group, key, name): tensor}."""
    from dslaunch.engine.base.partition import Layout
    from dslaunch.engine.storage.files import RankFiles
    from dslaunch.engine.storage.shard_index import ParamIndex

    path = str(ckpt_dir / (ckpt_dir / "latest").read_text().strip())
    files = RankFiles(path, _meta(ckpt_dir)["world_size"])
    out = {}
    for gi, g in enumerate(files.zero(0)["groups"]):
        idx = ParamIndex(Layout.from_meta(g["layout"]))
        for key in ["master", *g["state"]]:
            def shards(k, gi=gi, key=key):
                saved = files.zero(k)["groups"][gi]
                return saved["master"] if key == "master" else saved["state"][key]
            for name in idx.names():
                out[(gi, key, name)] = idx.gather(shards, name).clone()
        for k, v in g["scalars"].items():
            # the CPU optimizers count steps in an int, torch's in a float tensor: compare values
            out[(gi, "scalar", k)] = torch.as_tensor(v, dtype=torch.float64).reshape(())
    return out


def _assert_same_state(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, bad[:5]


@pytest.mark.parametrize("src,world", [("a", 3), ("b", 4)])
def test_reshape_moves_weights_and_optimizer_state_exactly(job_cache, work, src, world):
    """What `dslaunch ckpt reshape` and `ckpt to-fp32` run (called here without a process each:
    the CLI itself is exercised above)."""
    from dslaunch.engine.checkpoint.consolidate import to_fp32
    from dslaunch.engine.checkpoint.reshape import reshape

    old, new = (ck_a if src == "a" else ck_b)(job_cache), work / f"ck_{src}_to{world}"
    reshape(old, new, world)
    assert _meta(new)["world_size"] == world and _meta(new)["zero_stage"] == 3
    _assert_same_state(_optimizer_state(old), _optimizer_state(new))
    to_fp32(old, work / f"{src}.pt")
    to_fp32(new, work / f"{src}_to{world}.pt")
    a = torch.load(work / f"{src}.pt", weights_only=True)
    b = torch.load(work / f"{src}_to{world}.pt", weights_only=True)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


# -- single-process engines: automatic resharding on load, across stages -------------------------

def _engine(config, d_model=32):
    sys.path.insert(0, str(ROOT))
    import dslaunch
    from examples.gpt import GPT, GPTConfig

    torch.manual_seed(1)  # other initial weights than the jobs': the checkpoint must replace them
    model = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=2, d_model=d_model))
    engine, *_ = dslaunch.initialize(model=model, config=config)
    return engine


def test_load_reshards_exactly_from_stage3_to_stage2_and_back(job_cache, work):
    """2-rank stage 3 -> 1-rank stage 2 -> 1-rank stage 3 with offload and persistent (always
    gathered) parameters, each loaded by load_checkpoint and saved again: the optimizer state and
    the weights never change by a bit."""
    ck = ck_a(job_cache)
    e2 = _engine(_config(2))
    e2.load_checkpoint(ck)
    assert e2.global_steps == SAVE_AT
    e2.save_checkpoint(work / "ck_a_s2")
    e3 = _engine(_config(3, offload=True, persist=True))
    e3.load_checkpoint(work / "ck_a_s2")
    e3.save_checkpoint(work / "ck_a_s3")
    assert _meta(work / "ck_a_s2")["zero_stage"] == 2 and _meta(work / "ck_a_s3")["zero_stage"] == 3
    ref = _optimizer_state(ck)
    _assert_same_state(ref, _optimizer_state(work / "ck_a_s2"))
    _assert_same_state(ref, _optimizer_state(work / "ck_a_s3"))
    from dslaunch.engine.checkpoint.consolidate import fp32_state_dict

    # the weights of each (stage 3 keeps them in its shards only: consolidated)
    weights = [fp32_state_dict(d)[0] for d in (ck, work / "ck_a_s2", work / "ck_a_s3")]
    assert all(sorted(w) == sorted(weights[0]) for w in weights)
    assert all(torch.equal(w[k], weights[0][k]) for w in weights[1:] for k in w)


def test_mismatched_stage3_checkpoint_names_the_tensor(job_cache):
    from dslaunch.engine.storage.files import CheckpointError

    ck = ck_a(job_cache)
    with pytest.raises(CheckpointError, match=r"tensor 'tok_emb.weight' has shape \[256, 32\]"):
        _engine(_config(3), d_model=48).load_checkpoint(ck)
