"""MoE, the engine side (issue 22): expert gradients reduced over the expert-data-parallel group,
ZeRO 1/2 expert optimizer states partitioned within it, clipping counting each expert once,
checkpoints keeping experts per global id (resumed at another ep size, consolidated by
``dslaunch ckpt to-fp32``).

Two real gloo launches of tests/scripts/moe_engine_train.py (the 2-rank one, tests/moe_jobs.py,
also runs examples/train_moe_gpt.py and the other MoE test files' 2-rank scripts) (a tiny model
with two dslaunch.moe MoE layers, 4 experts, top-1 dropless deterministic routing, fp32, AdamW, gradient clipping that
clips every step), each training several configurations in turn for 20 steps beside a plain
single-process torch reference (all experts, the whole global batch, torch's AdamW and
clip_grad_norm_):

- 2 ranks: EP 1 at ZeRO 1, EP 2 at ZeRO 0, 1 and 2, EP 2 at ZeRO 0 resuming the EP 2 ZeRO 0
  run's step-10 checkpoint (stage 0 keeps optimizer states per rank: same ep size and world);
- 4 ranks: EP 1 at ZeRO 0, EP 4 at ZeRO 0 and 2, EP 2 at ZeRO 1 saving at step 10, then EP 4 at
  ZeRO 1 resuming that checkpoint (experts and their Adam states resharded by global id).

Tolerance: 1e-5 relative per step (the issue's bound; observed ~1.5e-7: the ranks sum gradients
in another order than the single process). The clipped norms agree to the same bound, so every
expert is counted once. Consolidation: the checkpoint's fp32 weights equal the reference's after
10 steps to 1e-5 (relative to the largest weight).
"""

import sys

import pytest
import torch
from moe_jobs import SAVE_AT, STEPS, two_rank_job

from helpers import SCRIPTS, dslaunch

sys.path.insert(0, str(SCRIPTS))
import moe_engine_train as net

TOL = 1e-5


def _job(job_cache, nproc, runs, *extra):
    job = job_cache.run(f"moe_engine_{nproc}", "moe_engine_train.py", "--out", "{dir}/out.json",
                        "--runs", runs, "--steps", STEPS, *extra, nproc=nproc,
                        timeout=400)
    return job


def _two(job_cache):
    return two_rank_job(job_cache, "moe_engine_2")


def _four(job_cache):
    return _job(job_cache, 4, "1:0,4:0,4:2,2:1,4:1:resumed", "--save-run", "2:1", "--save",
                "{dir}/ck", "--save-at", SAVE_AT, "--load-run", "4:1:resumed", "--load",
                "{dir}/ck", "--ref-state", "{dir}/ref_state.pt")


def _close(got, want, run):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= TOL * abs(b), (run, i, a, b)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_ep_size_and_stage_trains_like_one_process(job_cache, ranks):
    out = (_two if ranks == 2 else _four)(job_cache).json()
    ref = out["reference"]
    assert ref["losses"][-1] < ref["losses"][0]
    assert all(n > net.CLIP for n in ref["grad_norms"])  # clipping acts at every step
    for run, res in out["runs"].items():
        start = res["start"]
        _close(res["losses"], ref["losses"][start:], run)
        _close(res["grad_norms"], ref["grad_norms"][start:], run)
    resumed = "4:1:resumed" if ranks == 4 else "2:0:resumed"
    assert out["runs"][resumed]["start"] == SAVE_AT


def test_checkpoint_keeps_experts_by_global_id_and_consolidates(job_cache, tmp_path):
    job = _four(job_cache)
    ck = job.dir / "ck" / f"global_step{SAVE_AT}"
    for layer in range(2):
        for e in range(net.EXPERTS):
            assert (ck / f"layer_{layer}_expert_{e}_mp_rank_00_model_states.pt").is_file()
    dense = torch.load(ck / "model_states.pt", weights_only=True)["module"]
    assert not [k for k in dense if "deepspeed_experts" in k]
    p = dslaunch("ckpt", "to-fp32", job.dir / "ck", tmp_path / "w.pt")
    assert p.returncode == 0, p.stdout + p.stderr
    got = torch.load(tmp_path / "w.pt", weights_only=True)
    want = torch.load(job.dir / "ref_state.pt", weights_only=True)
    assert sorted(got) == sorted(want)
    scale = max(float(t.abs().max()) for t in want.values())
    for k, t in want.items():
        assert torch.allclose(got[k], t, rtol=0, atol=TOL * scale), k


def test_optimizer_groups_split_and_stage3_refused():
    import torch.distributed as dist

    import dslaunch
    from dslaunch.engine.parallel import expert_groups
    from dslaunch.engine.parallel.experts import split_optimizer_groups

    model = net.Net(1)
    opt = torch.optim.AdamW([{"params": list(model.parameters()), "lr": 0.1}])
    split_optimizer_groups(opt)
    assert len(opt.param_groups) == 2
    dense, experts = opt.param_groups
    assert dense["lr"] == experts["lr"] == 0.1 and "moe" not in dense
    assert experts["moe"] and experts["name"] == "ep_size_1"
    assert all(not p.allreduce for p in experts["params"])
    cfg = net.config(3)
    was_initialized = dist.is_initialized()
    try:
        with pytest.raises(ValueError, match="ZeRO stage 3 with MoE"):
            dslaunch.initialize(model=net.Net(1), config=cfg)
    finally:  # leave later tests no expert groups and no process group of ours
        expert_groups.reset()
        if not was_initialized and dist.is_initialized():
            dist.destroy_process_group()


def test_example_logs_aux_loss_and_dropped_tokens(job_cache):
    """examples/train_moe_gpt.py with configs/moe_gpt_zero1.json, EP 2 on 2 ranks: every logged
    step shows the aux loss and the fraction of tokens dropped; the JSON counts the all-to-alls."""
    job = two_rank_job(job_cache, "moe_example")
    lines = [ln for ln in job.log.splitlines() if "| aux " in ln]
    assert len(lines) == 4, job.log[-3000:]
    assert all("| dropped " in ln and "tokens/s" in ln for ln in lines)
    out = job.json()
    assert [s["step"] for s in out["steps"]] == [1, 2, 3, 4]
    assert all(0.0 <= s["dropped"] < 1.0 and s["aux_loss"] > 0 for s in out["steps"])
    assert out["all_to_all_bytes_per_step"] > 0  # booked in engine.comm_stats()
