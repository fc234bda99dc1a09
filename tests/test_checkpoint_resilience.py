"""Checkpoints that survive faults, resume at another world size, and save in the background
(issue 20, parts 3-4), with real multi-rank jobs through `dslaunch run`
(tests/scripts/ckpt_resume.py: `engine.load_checkpoint(dir)` at start, as DeepSpeed scripts do).

- A rank killed by SIGKILL in the middle of `save_checkpoint` (sync or async): `latest` still
  names the previous checkpoint, which the next job loads.
- `async_save` writes the same files as a synchronous save (every tensor equal; ZeRO 0, 2, 3), while training
  goes on (the same losses); `keep_last` keeps the newest tags.
- Elastic resume: 4 ranks -> 2 -> 3 with ZeRO 1, 2, 3 and the `elasticity` section: the global batch
  stays 24 (micro-batch and accumulation recomputed), the optimizer state is resharded, and the
  losses continue those of an uninterrupted 2-rank run (1e-5 relative: other world sizes sum the
  micro-batch gradients in another order).
"""

import json

import pytest
import torch

from helpers import launch, results

pytestmark = pytest.mark.slow

BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
        "gradient_clipping": 1.0}
ELASTIC = {"elasticity": {"enabled": True, "max_train_batch_size": 24, "micro_batch_sizes": [2, 4],
                          "version": 0.1},
           "optimizer": BASE["optimizer"], "zero_optimization": {"stage": 2},
           "checkpoint": {"async_save": True, "keep_last": 2}}


def _run(tmp_path, cfg, name, save_dir, nproc=2, env=None, check=True, **kw):
    args = _args(tmp_path, name, save_dir, **kw)
    return launch(tmp_path, cfg, "ckpt_resume.py", args, nproc=nproc, env=env, check=check,
                  timeout=240)


def _tensors_equal(a, b, where=""):
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _tensors_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _args(tmp_path, name, save_dir, **kw):
    args = ["--out", tmp_path / name, "--save-dir", save_dir]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", v]
    return args


def _together(job_cache, label, runs, nproc):
    """The runs ({name: (args, config)}, writing under a test's tmp_path) in ONE launch of
    ``nproc`` ranks, in order (JobCache.run_many); fails with the log of one that failed."""
    job_cache.run_many(label, "ckpt_resume.py", runs, nproc=nproc, timeout=240)
    return {name: job_cache.run(name, "ckpt_resume.py", *args, config=cfg, nproc=nproc,
                                timeout=240)
            for name, (args, cfg) in runs.items()}


def test_rank_killed_mid_save_leaves_latest_on_the_previous_checkpoint(job_cache, tmp_path):
    """Sync (0) and async (1) save, each its own checkpoint directory; the first jobs (2 steps)
    of both modes share one launch, as do the resumed ones: only the killed jobs are apart."""
    point, modes = "after_files@1", (0, 1)
    cfg = {**BASE, "train_batch_size": 6, "zero_optimization": {"stage": 1}}
    ck = {m: tmp_path / f"ck{m}" for m in modes}
    _together(job_cache, "ckpt_kill_first", {
        f"kill_a{m}": (_args(tmp_path, f"a{m}", ck[m], steps=2, async_save=m), cfg)
        for m in modes}, nproc=3)
    for m in modes:
        assert (ck[m] / "latest").read_text() == "global_step2"
        died = _run(tmp_path, cfg, f"b{m}", ck[m], nproc=3, steps=4, async_save=m, check=False,
                    env={"DSLAUNCH_TEST_CRASH_IN_SAVE": point})
        assert died.returncode != 0, (m, died.stdout[-2000:])
        assert (ck[m] / "latest").read_text() == "global_step2", m
        assert not (ck[m] / "global_step4").exists(), m
        # it really died mid-save: the other ranks' files are there
        assert (ck[m] / ".global_step4.tmp" / "rank_0_optim_states.pt").exists(), m
    _together(job_cache, "ckpt_kill_resumed", {
        f"kill_c{m}": (_args(tmp_path, f"c{m}", ck[m], steps=4, async_save=m), cfg)
        for m in modes}, nproc=3)
    for m in modes:
        c = results(tmp_path / f"c{m}", nproc=3)
        assert c[0]["start"] == 2 and c[0]["loaded"] == str(ck[m] / "global_step2"), m
        assert c[0]["client_state"] == {"samples_seen": 12}, m
        assert (ck[m] / "latest").read_text() == "global_step4", m
        assert not (ck[m] / ".global_step4.tmp").exists(), m


ASYNC_STAGES = (0, 2, 3)
ASYNC_ENV = {"DSLAUNCH_TEST_ASYNC_WRITE_DELAY": "1.5"}  # the async writer starts late: the next
# steps change the live state


def _save_mode_jobs(job_cache, stage):
    """The sync (0) and async (1) jobs of ``stage``, 6 steps, keep_last 2; the first asked for
    starts the six of ASYNC_STAGES in one launch (JobCache.run_many: one after the other in the
    same ranks, each waiting for its own writes at its end: engine.wait_checkpoint())."""
    runs = {f"save_s{s}_m{mode}": (("--out", "{dir}/out", "--save-dir", "{dir}/ck", "--steps", 6,
                                    "--async-save", mode, "--keep-last", 2),
                                   {**BASE, "zero_optimization": {"stage": s}})
            for s in ASYNC_STAGES for mode in (0, 1)}
    job_cache.run_many("ckpt_async", "ckpt_resume.py", runs, env=ASYNC_ENV, timeout=240)
    return [job_cache.run(name, "ckpt_resume.py", *runs[name][0], config=runs[name][1],
                          env=ASYNC_ENV, timeout=240)
            for name in (f"save_s{stage}_m0", f"save_s{stage}_m1")]


@pytest.mark.parametrize("stage", ASYNC_STAGES)
def test_async_save_writes_the_same_files_as_sync(job_cache, stage):
    jobs = _save_mode_jobs(job_cache, stage)
    (sync, asyn), (ck0, ck1) = ([j.results(sub="out") for j in jobs],
                                [j.dir / "ck" for j in jobs])
    assert sync[0]["losses"] == asyn[0]["losses"] and sync[0]["no_checkpoint_warning"]
    for d in (ck0, ck1):  # keep_last 2: global_step2 pruned
        assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["global_step4", "global_step6"]
        assert (d / "latest").read_text() == "global_step6"
    for tag in ("global_step4", "global_step6"):
        names = sorted(p.name for p in (ck0 / tag).iterdir())
        assert names == sorted(p.name for p in (ck1 / tag).iterdir())
        for name in names:
            if name.endswith(".pt"):
                _tensors_equal(torch.load(ck0 / tag / name, weights_only=True),
                               torch.load(ck1 / tag / name, weights_only=True), name)
        m0, m1 = (json.loads((d / tag / "metadata.json").read_text()) for d in (ck0, ck1))
        assert m0.pop("saved_at") < m1.pop("saved_at") and m0 == m1


@pytest.mark.parametrize("stage", [3])  # stages 1-2 reshard in test_checkpoint_reshape.py too
def test_elastic_resume_4_to_2_to_3_ranks_keeps_the_global_batch(job_cache, tmp_path, stage):
    ck = tmp_path / "ck"
    cfg = {**ELASTIC, "zero_optimization": {"stage": stage}}
    _run(tmp_path, cfg, "r4", ck, nproc=4, steps=4)
    meta = json.loads((ck / "global_step4" / "metadata.json").read_text())
    assert (meta["world_size"], meta["train_batch_size"], meta["gradient_accumulation_steps"]) == (4, 24, 3)
    # the uninterrupted 2-rank reference and the resumed 2-rank job: one launch, in this order
    out2 = _together(job_cache, f"elastic_2ranks_s{stage}", {
        f"elastic_ref_s{stage}": (_args(tmp_path, "ref", tmp_path / "ref_ck", steps=8,
                                        save_every=100), cfg),
        f"elastic_r2_s{stage}": (_args(tmp_path, "r2", ck, steps=6), cfg)},
        nproc=2)[f"elastic_r2_s{stage}"].proc
    assert ("saved with world size 4, micro 2 x accumulation 3 x data-parallel 4 = batch 24; now "
            "world size 2, micro 4 x accumulation 3 x data-parallel 2 = batch 24 (optimizer state "
            "resharded); the global batch is the same") in out2.stdout
    _run(tmp_path, cfg, "r3", ck, nproc=3, steps=8)
    ref, r4, r2, r3 = (results(tmp_path / n, nproc=k)[0] for n, k in
                       (("ref", 2), ("r4", 4), ("r2", 2), ("r3", 3)))
    assert ref["no_checkpoint_warning"] and ref["loaded"] is None
    assert [r["batch"] for r in (r4, r2, r3)] == [[24, 2, 3], [24, 4, 3], [24, 4, 2]]
    assert (r2["start"], r3["start"]) == (4, 6)
    assert r3["client_state"] == {"samples_seen": 6 * 24}
    got = r4["losses"] + r2["losses"] + r3["losses"]
    assert max(abs(x - y) / abs(y) for x, y in zip(got, ref["losses"])) <= 1e-5, (got, ref["losses"])
    assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ["global_step6", "global_step8"]
