"""Checkpoint resume exactness and crash-during-save safety, with real 2-rank jobs via `dslaunch run`.

A: 6 uninterrupted steps. B: 3 steps, save. Then a job that loads B, trains to step 5 and dies
in the middle of saving (every rank exits after writing its files, before the rename). C: loads
`latest` (still B's checkpoint), trains steps 3-5: its losses must equal A's bit for bit (fp32).
A and B run one after the other in the same two ranks (JobCache.run_many).
D: one rank loads the same 2-rank stage 0 checkpoint (stage 0's optimizer state is the same on
every rank, so any job size reads it): losses within 1e-5 relative of A's (one rank sums the
micro-batch gradients in another order than two; observed ~1e-7), the same learning rates.
"""

import json

from helpers import launch, results

CFG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
       "scheduler": {"type": "WarmupDecayLR",
                     "params": {"warmup_num_steps": 3, "total_num_steps": 10,
                                "warmup_max_lr": 2e-3, "warmup_type": "linear"}},
       "gradient_clipping": 1.0}


def test_resume_is_bit_identical_and_crash_leaves_previous(job_cache, tmp_path):
    ckpt = tmp_path / "ckpt"
    # A and B in one launch (JobCache.run_many: torch imported once per rank for both)
    runs = {"resume_a": (("--out", tmp_path / "a", "--steps", 6), CFG),
            "resume_b": (("--out", tmp_path / "b", "--steps", 3, "--save-dir", ckpt,
                          "--save-at", 3), CFG)}
    job_cache.run_many("resume_ab", "engine_train.py", runs)
    for name, (args, cfg) in runs.items():
        job_cache.run(name, "engine_train.py", *args, config=cfg)  # raises with the log if failed
    assert (ckpt / "latest").read_text() == "global_step3"
    meta = json.loads((ckpt / "global_step3" / "metadata.json").read_text())
    assert meta["world_size"] == 2 and meta["zero_stage"] == 0 and meta["dtype"] == "fp32"
    assert sorted(p.name for p in (ckpt / "global_step3").iterdir()) == [
        "metadata.json", "model_states.pt", "rank_0_optim_states.pt", "rank_1_optim_states.pt"]

    crashed = launch(tmp_path, CFG, "engine_train.py",
                     ["--out", tmp_path / "crash", "--steps", 5, "--load-dir", ckpt,
                      "--save-dir", ckpt, "--save-at", 5],
                     env={"DSLAUNCH_TEST_CRASH_IN_SAVE": "after_files"}, check=False)
    assert crashed.returncode != 0, crashed.stdout
    tmp = ckpt / ".global_step5.tmp"
    assert (tmp / "model_states.pt").exists()  # it really died mid-save
    assert not (ckpt / "global_step5").exists()
    assert (ckpt / "latest").read_text() == "global_step3"

    launch(tmp_path, CFG, "engine_train.py", ["--out", tmp_path / "c", "--steps", 6,
                                              "--load-dir", ckpt])
    a, c = results(tmp_path / "a"), results(tmp_path / "c")
    for ra, rc in zip(a, c):
        assert rc["start"] == 3 and rc["client_state"] == {"step": 3}
        assert rc["losses"] == ra["losses"][3:]  # bit-identical
        assert rc["lrs"] == ra["lrs"][3:]
        assert rc["param_sums"] == ra["param_sums"][3:]
        assert rc["global_steps"] == 6 and rc["global_samples"] == 48
    b = results(tmp_path / "b")
    assert b[0]["losses"] == a[0]["losses"][:3]

    launch(tmp_path, CFG, "engine_train.py", ["--out", tmp_path / "d", "--steps", 6,
                                              "--load-dir", ckpt], nproc=1)
    (d,) = results(tmp_path / "d", nproc=1)
    assert d["start"] == 3 and d["world"] == 1 and d["lrs"] == a[0]["lrs"][3:]
    assert max(abs(x - y) / abs(y) for x, y in zip(d["losses"], a[0]["losses"][3:])) <= 1e-5
