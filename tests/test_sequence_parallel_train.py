"""Ulysses sequence parallelism end to end: examples/train_gpt.py --sp N through `dslaunch run`
trains to the losses of a plain single-process run (fp32, within 1e-5 relative over 20 steps) at
SP 2 (ZeRO 2, 2 ranks), SP 4 (ZeRO 3) and SP 2 x DP 2 (ZeRO 3); the checkpoint written at SP 2
resumes at SP 1 on the reference's losses. Plus the grid arithmetic and the config, in process.

Launches: the two 4-rank runs in one (JobCache.run_many: one after the other in the same ranks),
2 ranks x 1, single process x 2."""

import json

import pytest

from dslaunch.config import resolve_config
from dslaunch.engine.parallel.topology import TopologyError, make_topology
from helpers import EXAMPLES, ROOT, run_python

MODEL = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "32",
         "--data-bytes", "200000", "--log-every", "10"]
STEPS = 20
RTOL = 1e-5
BASE = {"train_batch_size": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "gradient_clipping": 1.0, "steps_per_print": 50}
# name -> (ranks, sequence_parallel_size, ZeRO stage)
RUNS = {"sp2_zero2": (2, 2, 2), "sp4_zero3": (4, 4, 3), "sp2xdp2_zero3": (4, 2, 3)}


def _config(tmp, name, sp, stage):
    cfg = dict(BASE, zero_optimization={"stage": stage},
               **({"sequence_parallel_size": sp} if sp > 1 else {}))
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, job_cache):
    tmp = tmp_path_factory.mktemp("sp_train")
    out = {}
    ref_cfg = _config(tmp, "ref", 1, 2)
    run_python(EXAMPLES / "train_gpt.py", [*MODEL, "--steps", STEPS + 10, "--deepspeed_config",
                                           ref_cfg, "--losses-out", tmp / "ref.out"])
    out["ref"] = json.loads((tmp / "ref.out").read_text())
    args = {}
    for name, (_, sp, stage) in RUNS.items():
        extra = ["--checkpoint-dir", tmp / "ck"] if name == "sp2_zero2" else []
        args[name] = [*MODEL, "--steps", STEPS, "--sp", sp, "--losses-out", tmp / f"{name}.out",
                      "--config", _config(tmp, name, sp, stage), *extra]
    # the two 4-rank runs one after the other in the same ranks (one launch)
    job_cache.run_many("sp_train", EXAMPLES / "train_gpt.py", {
        name: (args[name], None) for name, (nproc, _, _) in RUNS.items() if nproc == 4},
        nproc=4, timeout=240)
    for name, (nproc, _, _) in RUNS.items():
        job_cache.run(name, EXAMPLES / "train_gpt.py", *args[name], nproc=nproc, timeout=240)
        out[name] = json.loads((tmp / f"{name}.out").read_text())
    # the SP 2 checkpoint (step 20) resumed by a plain single-process run
    run_python(EXAMPLES / "train_gpt.py", [*MODEL, "--steps", STEPS + 10, "--deepspeed_config",
                                           ref_cfg, "--checkpoint-dir", tmp / "ck",
                                           "--losses-out", tmp / "resumed.out"])
    out["resumed"] = json.loads((tmp / "resumed.out").read_text())
    return out


def _rel(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", list(RUNS))
def test_losses_equal_single_process(runs, name):
    ranks, sp, _ = RUNS[name]
    assert (runs[name]["sp"], runs[name]["dp"]) == (sp, ranks // sp)
    assert _rel(runs["ref"]["losses"][:STEPS], runs[name]["losses"]) <= RTOL


def test_sp2_checkpoint_resumes_at_sp1(runs):
    assert len(runs["resumed"]["losses"]) == 10  # steps 21-30, after the resume
    assert _rel(runs["ref"]["losses"][STEPS:], runs["resumed"]["losses"]) <= RTOL


def test_grid_has_a_sequence_axis():
    topo = make_topology(8, model=2, sequence=2)  # data 2 x sequence 2 x model 2
    assert topo.axes == ["pipe", "data", "sequence", "model"]
    assert topo.get_axis_comm_lists("sequence") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists("data") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert make_topology(4, model=2).axes == ["pipe", "data", "model"]  # unchanged without SP
    with pytest.raises(TopologyError, match="sequence parallel 4"):
        make_topology(6, sequence=4)


def test_config_accepts_sequence_parallel_size():
    cfg = resolve_config(str(ROOT / "configs/gpt_long_context.json"), world_size=4)
    assert cfg.get("sequence_parallel_size") == 2
    assert cfg.dp_world_size == 2 and cfg.train_micro_batch_size_per_gpu == 2  # DP ranks only
