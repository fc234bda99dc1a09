"""ZeRO-Infinity offload to NVMe (optimizer states, and stage 3's parameter shards), end to end:
real 2-rank gloo jobs through `dslaunch run`, the tiny GPT of examples/gpt.py, compared with CPU
offload on the same data; plus the parameter store in one process.

The arithmetic is the same (the same CPU Adam steps the same fp32 shards; only where the states
rest between steps differs), so the losses must agree to 1e-5 relative (the issue's bound) and are
in fact expected bit-identical. The swap directory lives under pytest's tmp_path (a disk here; where
O_DIRECT is refused the handle falls back to buffered I/O, the result is the same).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import EXAMPLES, ROOT, dslaunch, launch, rank_env, run_argv

SCRIPT = "nvme_train.py"
STEPS = 6
SAVE_AT = 3
pytestmark = pytest.mark.slow
# Launches: the jobs of FIRST in one `dslaunch run` (JobCache.run_many), the four resumes in a
# second, the failure / stop / kill / RSS / optimizer jobs each their own.
KEY = "zero_optimization.offload_optimizer.nvme_path"


def _config(stage, device, nvme_path=None, buffer_count=4, sub_group=3000, bucket=8000,
            param=None, bf16=False):
    """``param``: the offload_param section; with it, stage 3 gathers per module (small
    persistence threshold and prefetch budget), so shards move at every forward and backward."""
    off = {"device": device}
    if device == "nvme":
        off.update(nvme_path=str(nvme_path), buffer_count=buffer_count)
    zero = {"stage": stage, "reduce_bucket_size": bucket, "sub_group_size": sub_group,
            "offload_optimizer": off}
    if param is not None:
        zero.update(offload_param=param, stage3_param_persistence_threshold=100,
                    stage3_prefetch_bucket_size=3000)
    c = {"train_batch_size": 8, "gradient_accumulation_steps": 2,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
         "gradient_clipping": 0.5, "steps_per_print": 1000,
         "aio": {"block_size": 65536, "queue_depth": 4, "thread_count": 2},
         "zero_optimization": zero}
    if bf16:
        c["bf16"] = {"enabled": True}
    return c


def _launch(workdir: Path, name: str, config: dict, *args, check=True, env=None, nproc=2):
    """A one-off job of tests/scripts/nvme_train.py (not cached; 2 ranks unless told): its
    results, or with check=False the CompletedProcess. The launcher's default grace period, as a
    user gets it."""
    out = workdir / f"{name}.out.json"
    p = launch(workdir, config, SCRIPT, ["--out", out, *args], nproc=nproc, env=env, check=check,
               timeout=300, grace_period=None)
    if not check:
        return p
    res = json.loads(out.read_text())
    res["losses"] = {int(k): v for k, v in res["losses"].items()}
    return res


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """This file's scratch directory: the swap directories (which the tests check are emptied)
    and one-off jobs."""
    return tmp_path_factory.mktemp("nvme")


def _swap_root(work, name):
    d = work / f"swap_{name}"
    d.mkdir(exist_ok=True)
    return d


def _spec(work, name, stage, device, *, resume_from=None, **kw):
    """The arguments and config of the job ``name`` (see ``_run``)."""
    swap = _swap_root(work, name) if device == "nvme" or kw.get("param") else None
    if kw.get("param", {}).get("device") == "nvme":
        kw["param"] = dict(kw["param"], nvme_path=str(swap))
    args = ["--out", "{dir}/out.json", "--steps", str(STEPS)]
    if resume_from:
        args += ["--load", str(resume_from.dir / "ck")]
    else:
        args += ["--save", "{dir}/ck", "--save-at", str(SAVE_AT)]
    return args, _config(stage, device, swap, **kw)


def _run(job_cache, work, name, stage, device, *, resume_from=None, **kw):
    """The job ``name``, run once per session: ``.json()`` its results (losses by int step),
    ``.dir / "ck"`` its checkpoint (saved at SAVE_AT, unless it resumes from the Job
    ``resume_from``'s). The first one asked for starts every job of FIRST in one launch."""
    if resume_from is None:
        job_cache.run_many("nvme", SCRIPT, {
            n: _spec(work, n, *spec[:2], **spec[2]) for n, spec in FIRST.items()}, timeout=300)
    args, config = _spec(work, name, stage, device, resume_from=resume_from, **kw)
    return job_cache.run(name, SCRIPT, *args, config=config, timeout=300)


def _max_rel(ref, other):
    assert set(other) <= set(ref) and other
    return max(abs(ref[k] - other[k]) / abs(ref[k]) for k in other)


# stage 2 runs with one swap buffer (no overlap: write, then read) and the resumed run with two
# (the prefetch waits for the write-back into the same buffer); the others with the default four
BUFFERS = {2: 1, 3: 4}

# -- offload_param: {device: nvme} (stage 3's parameter shards in files) ----------------------------

PARAM_NVME = {"device": "nvme", "max_in_cpu": 0, "buffer_count": 3}  # every shard on the drive
PARAM_PART = {"device": "nvme", "max_in_cpu": 4000, "buffer_count": 2}  # some kept in CPU memory
PARAM_RUNS = {  # name: (optimizer offload, offload_param, bf16)
    "pcpu3": ("cpu", {"device": "cpu"}, False),
    "pnvme3": ("nvme", PARAM_NVME, False),
    "pcpu3_bf16": ("cpu", {"device": "cpu"}, True),
    "pnvme3_bf16": ("cpu", PARAM_PART, True),
    # DeepSpeed's defaults (max_in_cpu 1e9: this model's whole shard stays in memory, no swap
    # buffer); it failed at the first step's write ("all 0 parameter swap buffers are held")
    "pnvme3_defaults": ("cpu", {"device": "nvme"}, False),
}
# the jobs that start from scratch: name -> (stage, optimizer offload device, _config options),
# all in one 2-rank launch (JobCache.run_many: one after the other in the same ranks)
FIRST = {"cpu3": (3, "cpu", {}), "nvme3": (3, "nvme", {"buffer_count": BUFFERS[3]}),
         "cpu2": (2, "cpu", {}), "nvme2": (2, "nvme", {"buffer_count": BUFFERS[2]}),
         **{name: (3, opt, {"param": param, "bf16": bf16})
            for name, (opt, param, bf16) in PARAM_RUNS.items()}}


@pytest.mark.parametrize("stage", [3, 2])
def test_nvme_losses_match_cpu_offload(job_cache, work, stage):
    cpu = _run(job_cache, work, f"cpu{stage}", stage, "cpu").json()
    nvme = _run(job_cache, work, f"nvme{stage}", stage, "nvme",
                buffer_count=BUFFERS[stage]).json()
    assert nvme["optimizer"] == "NVMeSwappedOptimizer" and cpu["optimizer"] == "DSCPUAdam"
    assert all(r["swap"]["buffers"] == BUFFERS[stage] for r in nvme["ranks"])
    assert len(nvme["losses"]) == STEPS
    assert _max_rel(cpu["losses"], nvme["losses"]) <= 1e-5
    assert nvme["losses"] == cpu["losses"]  # same arithmetic: bit-identical in practice
    assert nvme["losses"][STEPS - 1] < nvme["losses"][0]  # it trains


def test_stage1_with_torch_sgd_lamb_adagrad_and_bf16_adam(work):
    """Optimizers the compiled CPU Adam does not replace step their CPU shards themselves; the
    swapper learns their per-element states (momentum_buffer; exp_avg/exp_avg_sq; sum) from the
    first step. AdamW runs in bf16 (fp32 masters, DSCPUAdam). ZeRO stage 1, both offload devices
    trained in one job."""
    root = _swap_root(work, "optimizers")
    out = work / "optimizers.out.json"
    launch(work, None, "nvme_optimizers.py", ["--nvme-path", root, "--out", out, "--stage", 1],
           timeout=300, grace_period=None)
    res = json.loads(out.read_text())
    expect = {"SGD": ["momentum_buffer"], "Lamb": ["exp_avg", "exp_avg_sq"], "Adagrad": ["sum"],
              "AdamW": ["exp_avg", "exp_avg_sq"]}
    for name, states in expect.items():
        assert res[name]["nvme"]["optimizer"] == res[name]["cpu"]["optimizer"] == \
            ("DSCPUAdam" if name == "AdamW" else name)
        assert sorted(res[name]["nvme"]["swapped"]) == states
        assert res[name]["nvme"]["losses"] == res[name]["cpu"]["losses"], name
    assert list(root.iterdir()) == []


def test_states_live_in_swap_files_and_are_removed(job_cache, work):
    nvme = _run(job_cache, work, "nvme3", 3, "nvme").json()
    for r in nvme["ranks"]:
        swap = r["swap"]
        # during training each rank had its own files holding all its states and its fp32
        # master shard
        assert r["swap_files"] == {"optimizer_states.swp": swap["file_bytes"],
                                   "fp32_master.swp": swap["master_file_bytes"]}
        assert f"rank{r['rank']}" in swap["path"] and str(work / "swap_nvme3") in swap["path"]
        assert swap["subgroups"] > 1 and swap["steps"] == STEPS
        # every step reads and writes every sub-group, but the first step reads nothing (fresh
        # states); the checkpoint save reads the whole file once
        assert swap["write_bytes"] == STEPS * swap["file_bytes"]
        assert swap["read_bytes"] == (STEPS - 1 + 1) * swap["file_bytes"]
        # the masters: written once at start and after every step; read for every step, for the
        # new parameters after it (all-gather / parameter store), and once by the save
        m = swap["master_file_bytes"]
        assert swap["master_write_bytes"] == (1 + STEPS) * m
        assert swap["master_read_bytes"] == (2 * STEPS + 1) * m
    assert list((work / "swap_nvme3").iterdir()) == []  # removed at exit


def test_memory_breakdown_reports_states_on_nvme(job_cache, work):
    cpu = _run(job_cache, work, "cpu3", 3, "cpu").json()
    nvme = _run(job_cache, work, "nvme3", 3, "nvme").json()
    for rc, rn in zip(cpu["ranks"], nvme["ranks"]):
        # CPU offload: fp32 master + Adam's two states (3 x the shard); NVMe: only the buffers
        # (states' and masters'), the master and the states are in the files
        master = rc["memory"]["optimizer"]["cpu"] // 3
        assert rc["memory"]["optimizer"]["cpu"] == 3 * master > 0
        swap = rn["swap"]
        assert rn["memory"]["optimizer"]["cpu"] == swap["buffer_bytes"]
        assert swap["master_buffer_bytes"] < swap["buffer_bytes"]
        assert swap["file_bytes"] >= 2 * master and swap["master_file_bytes"] >= master
        assert rn["memory"]["optimizer"]["nvme"] == swap["file_bytes"] + swap["master_file_bytes"]
        # the whole rank: CPU lower by the master and the states, less the swap buffers
        assert rc["memory"]["total"]["cpu"] - rn["memory"]["total"]["cpu"] == \
            3 * master - swap["buffer_bytes"]
        assert rn["memory"]["params"] == rc["memory"]["params"]
        assert rn["memory"]["grads"] == rc["memory"]["grads"]


def test_resume_is_exact_and_checkpoints_are_portable(job_cache, work):
    """An NVMe checkpoint resumes exactly, and cpu <-> nvme checkpoints load into each other."""
    nvme_job = _run(job_cache, work, "nvme3", 3, "nvme")
    cpu_job = _run(job_cache, work, "cpu3", 3, "cpu")
    nvme, cpu = nvme_job.json(), cpu_job.json()
    _resumes(job_cache, work)
    later = {k: v for k, v in nvme["losses"].items() if k >= SAVE_AT}
    for name, device, source in (("resume_nvme", "nvme", nvme_job),
                                 ("cpu_from_nvme", "cpu", nvme_job),
                                 ("nvme_from_cpu", "nvme", cpu_job)):
        res = _run(job_cache, work, name, 3, device, resume_from=source, buffer_count=2).json()
        if device == "nvme":
            assert all(r["swap"]["buffers"] == 2 for r in res["ranks"])
        assert sorted(res["losses"]) == list(range(SAVE_AT, STEPS)), name
        assert res["losses"] == later, name
    assert cpu["losses"] == nvme["losses"]


def _resumes(job_cache, work):
    """The four jobs that resume from a FIRST job's checkpoint, in one 2-rank launch."""
    nvme3, cpu3, pnvme3 = (_run(job_cache, work, n, *FIRST[n][:2], **FIRST[n][2])
                           for n in ("nvme3", "cpu3", "pnvme3"))
    job_cache.run_many("nvme_resume", SCRIPT, {
        "resume_nvme": _spec(work, "resume_nvme", 3, "nvme", resume_from=nvme3, buffer_count=2),
        "cpu_from_nvme": _spec(work, "cpu_from_nvme", 3, "cpu", resume_from=nvme3,
                               buffer_count=2),
        "nvme_from_cpu": _spec(work, "nvme_from_cpu", 3, "nvme", resume_from=cpu3,
                               buffer_count=2),
        "resume_pnvme3": _spec(work, "resume_pnvme3", 3, "nvme", resume_from=pnvme3,
                               param=PARAM_NVME, bf16=False)}, timeout=300)


def test_swap_files_removed_when_the_job_fails(work):
    """Rank 1 raises (atexit cleans its files); rank 0, blocked in a collective, is stopped with
    SIGTERM by its agent (the swap module's handler cleans its files before dying of it)."""
    root = _swap_root(work, "fail")
    p = _launch(work, "fail", _config(2, "nvme", root), "--steps", "4", "--fail-at", "2",
                check=False)
    assert p.returncode != 0 and "planned failure" in p.stdout + p.stderr
    assert list(root.iterdir()) == []


def test_swap_files_removed_when_the_job_is_stopped(work):
    """SIGTERM to the launcher mid-training: the agent SIGTERMs the ranks, whose handler (the
    swap module's, installed since nobody else handles SIGTERM) removes the files first."""
    root = _swap_root(work, "sigterm")
    cfg = work / "sigterm.json"
    cfg.write_text(json.dumps(_config(2, "nvme", root)))
    p = subprocess.Popen(run_argv(SCRIPT, ["--out", work / "sigterm.out.json", "--steps", 100000],
                                  cfg, grace_period=None),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=rank_env())
    try:
        deadline = time.monotonic() + 120
        while len(list(root.glob("*/rank*/optimizer_states.swp"))) < 2:
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read()[-3000:]
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143
    assert list(root.iterdir()) == []


_HOLDER = """
import os, sys, signal
from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir
d = make_swap_dir(sys.argv[1], 0)
open(os.path.join(d, "optimizer_states.swp"), "w").write("x")
print(d, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""


def test_a_killed_rank_leaves_files_the_next_job_removes(work):
    """SIGKILL runs no cleanup: the next job using the nvme_path removes the directory, because
    its flock died with its process; a live process's directory (lock held) is left alone."""
    root = _swap_root(work, "killed")
    run = lambda how: subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), how],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       cwd=ROOT)
    live = run("live")  # first: its start-up scan must not see the killed one's directory
    live_dir = Path(live.stdout.readline().strip()).parent
    killed = run("kill")
    dead_dir = Path(killed.stdout.readline().strip()).parent
    killed.wait()
    assert killed.returncode == -signal.SIGKILL and dead_dir.is_dir() and live_dir.is_dir()
    from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir, remove_swap_dir

    mine = make_swap_dir(root, 3)
    assert not dead_dir.exists() and live_dir.is_dir()
    live.communicate("")  # the live one exits normally: atexit removes its directory
    assert not live_dir.exists()
    remove_swap_dir(mine)
    assert list(root.iterdir()) == []


def test_bad_nvme_path_is_a_clear_error(work):
    missing = work / "no_such_dir"
    # one rank: each rank checks its own nvme_path before any collective, a second adds nothing
    p = _launch(work, "bad_missing", _config(2, "nvme", missing), "--steps", "1", check=False,
                nproc=1)
    assert p.returncode != 0
    assert f"{KEY}: {missing} does not exist" in p.stdout + p.stderr
    from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir

    a_file = work / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=f"{KEY}: {a_file} is not a directory"):
        make_swap_dir(a_file, 0)
    with pytest.raises(ValueError, match=f"{KEY}: missing"):
        make_swap_dir(None, 0)


def test_config_errors(work):
    """A missing nvme_path (for either section) and nvme on the wrong stage are refused by
    validation; offload_param nvme with a path is valid."""
    c = _config(3, "nvme", work)
    del c["zero_optimization"]["offload_optimizer"]["nvme_path"]
    cfg = work / "nopath.json"
    cfg.write_text(json.dumps(c))
    p = dslaunch("config", "validate", cfg)
    assert p.returncode != 0 and f"{KEY}: missing" in p.stdout + p.stderr
    c = _config(3, "nvme", work)
    c["zero_optimization"]["offload_param"] = {"device": "nvme"}
    cfg.write_text(json.dumps(c))
    p = dslaunch("config", "validate", cfg)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "zero_optimization.offload_param.nvme_path: missing" in out
    c["zero_optimization"]["offload_param"]["nvme_path"] = str(work)
    cfg.write_text(json.dumps(c))
    p = dslaunch("config", "validate", cfg)
    assert p.returncode == 0, p.stdout + p.stderr  # parameter offload to NVMe is supported
    from dslaunch.config import ConfigError, resolve_config

    c = _config(1, "nvme", work)
    c["zero_optimization"]["stage"] = 0
    with pytest.raises(ConfigError, match="offload_optimizer.device: nvme needs zero_optimization"
                                          ".stage 1, 2 or 3"):
        resolve_config(c, world_size=2)
    resolve_config(ROOT / "configs" / "zero3_nvme_offload.json", world_size=2)


def test_peak_rss_lower_than_cpu_offload(work):
    """A model whose Adam states are clearly bigger than the swap buffers (12.6M parameters:
    ~50 MB of states per rank, 2 buffers of 8 MB): the ranks' peak RSS must be lower with NVMe,
    by at least half of what the breakdown says was moved out (states minus buffers).

    Both runs fix glibc's mmap threshold (128 KiB): by default it grows after the first big
    free, and freed blocks then stay in the heap, so RSS would measure the allocator's history
    (tens of MB either way on this model) rather than what the process holds."""
    big = ["--steps", "2", "--d-model", "512", "--n-layer", "4", "--seq", "32", "--batch", "4"]
    sub = dict(buffer_count=2, sub_group=1 << 20, bucket=1 << 21)
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    cpu = _launch(work, "rss_cpu", _config(3, "cpu", **sub), *big, env=env)
    nvme = _launch(work, "rss_nvme", _config(3, "nvme", _swap_root(work, "rss"), **sub), *big,
                   env=env)
    assert nvme["losses"] == cpu["losses"]
    for rc, rn in zip(cpu["ranks"], nvme["ranks"]):
        moved = rc["memory"]["optimizer"]["cpu"] - rn["memory"]["optimizer"]["cpu"]
        assert moved > 0
        assert rc["peak_rss"] - rn["peak_rss"] >= moved / 2, (rc["peak_rss"], rn["peak_rss"], moved)


def _param_run(job_cache, work, name, resume_from=None):
    opt, param, bf16 = PARAM_RUNS[name.replace("resume_", "")]
    return _run(job_cache, work, name, 3, opt, param=param, bf16=bf16, resume_from=resume_from)


@pytest.mark.parametrize("ref,name", [("pcpu3", "pnvme3"), ("pcpu3_bf16", "pnvme3_bf16"),
                                      ("pcpu3", "pnvme3_defaults")])
def test_param_nvme_losses_match_param_cpu(job_cache, work, ref, name):
    """Parameters (and, fp32, optimizer states) on NVMe train exactly like offload_param cpu."""
    cpu, nvme = _param_run(job_cache, work, ref).json(), _param_run(job_cache, work, name).json()
    assert len(nvme["losses"]) == STEPS
    assert _max_rel(cpu["losses"], nvme["losses"]) <= 1e-5
    assert nvme["losses"] == cpu["losses"]  # the same arithmetic: bit-identical in practice
    assert nvme["losses"][STEPS - 1] < nvme["losses"][0]


def test_param_shards_live_in_files_not_in_memory(job_cache, work):
    cpu = _param_run(job_cache, work, "pcpu3").json()
    nvme = _param_run(job_cache, work, "pnvme3").json()
    for rc, rn in zip(cpu["ranks"], nvme["ranks"]):
        ps = rn["param_swap"]
        shard_bytes = rn["memory"]["grads"]["cpu"]  # the fp32 gradient shard: as many elements
        assert ps["in_cpu_numel"] == 0 and 4 * ps["on_nvme_numel"] == shard_bytes
        # the file held the whole shard, each chunk 4 KiB-aligned, next to the optimizer's file
        assert rn["swap_files"]["params.swp"] == ps["file_bytes"] >= shard_bytes
        assert "optimizer_states.swp" in rn["swap_files"]
        assert f"rank{rn['rank']}" in ps["path"] and str(work / "swap_pnvme3") in ps["path"]
        # CPU memory: the shard is gone, the swap buffers came instead; the file is under nvme
        assert rc["memory"]["params"]["cpu"] - rn["memory"]["params"]["cpu"] == \
            shard_bytes - ps["buffer_bytes"]
        assert ps["buffer_bytes"] < shard_bytes and ps["buffers"] == 3
        assert rn["memory"]["params"]["nvme"] == ps["file_bytes"]
        # every step wrote the shard back; the gathers read it, mostly from reads started ahead
        assert ps["write_bytes"] >= STEPS * shard_bytes
        assert ps["read_bytes"] > ps["write_bytes"] and 0 < ps["read_ahead_used"] <= ps["reads"]
    part = _param_run(job_cache, work, "pnvme3_bf16").json()["ranks"][0]["param_swap"]
    assert 0 < part["in_cpu_numel"] <= 4000 and part["on_nvme_numel"] > 0
    assert list((work / "swap_pnvme3").iterdir()) == []  # removed at exit
    assert list((work / "swap_pnvme3_bf16").iterdir()) == []


def test_param_nvme_resume_is_exact(job_cache, work):
    source = _param_run(job_cache, work, "pnvme3")
    nvme = source.json()
    _resumes(job_cache, work)
    res = _param_run(job_cache, work, "resume_pnvme3", resume_from=source).json()
    assert res["losses"] == {k: v for k, v in nvme["losses"].items() if k >= SAVE_AT}


def _tiny_plan(world=1):
    import torch

    from dslaunch.engine.zero.common import named_groups
    from dslaunch.engine.zero.stage3_units import plan_units

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 20))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return plan_units(model, named_groups(model, opt), world, cap=2000, persistence_threshold=25)


def test_param_store_round_trip_and_read_ahead(work):
    """In one process: the shard written through the store comes back from the file, also via
    buffers filled by read_ahead; chunks over max_in_cpu are in the file, the rest in memory."""
    import torch

    from dslaunch.engine.zero.nvme.param_store import NVMeParamStore
    from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir, remove_swap_dir
    from dslaunch.engine.zero.stage3_fetch import RELEASED

    plan = _tiny_plan()
    d = make_swap_dir(_swap_root(work, "store"), 0, key="zero_optimization.offload_param")
    store = NVMeParamStore(plan, torch.float32, torch.device("cpu"), None, d, buffer_count=2,
                           max_in_cpu=700, aio={"block_size": 4096, "queue_depth": 2})
    assert store.swap_stats()["in_cpu_numel"] <= 700 < sum(store.numel.values())
    values = torch.randn(plan.layouts[0].shard_numel)
    store.write_shard(0, values)
    assert torch.equal(store.read_shard(0), values)
    on_file = sorted(store.offset)
    for k in on_file:
        store.state[k] = RELEASED
    store.read_ahead(on_file)
    assert store.stats["read_ahead"] == min(2, len(on_file))
    assert torch.equal(store.read_shard(0), values)  # read-ahead buffers, then the file
    assert store.stats["read_ahead_used"] == store.stats["read_ahead"]
    store.write_chunk(on_file[0], torch.ones(store.numel[on_file[0]]))
    assert os.path.getsize(store.path) == store.file_bytes
    import numpy as np

    raw = np.fromfile(store.path, dtype=np.float32, count=store.numel[on_file[0]],
                      offset=store.offset[on_file[0]])
    assert (raw == 1).all()  # the chunk's bytes are in the file, where the layout says
    remove_swap_dir(d)
    assert list((work / "swap_store").iterdir()) == []


def test_param_nvme_bad_settings_name_the_key(work):
    import torch

    from dslaunch.config import resolve_config
    from dslaunch.engine.zero.nvme.param_store import NVMeParamStore, nvme_param_store
    from dslaunch.engine.zero.nvme.swap_dir import make_swap_dir, remove_swap_dir

    key = "zero_optimization.offload_param"
    missing = work / "no_such_param_dir"
    cfg = resolve_config({"train_batch_size": 1, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(missing)}}}).typed
    with pytest.raises(ValueError, match=f"{key}.nvme_path: {missing} does not exist"):
        nvme_param_store(None, torch.float32, torch.device("cpu"), None,
                         cfg.zero_optimization.offload_param, cfg.aio, 0)
    d = make_swap_dir(_swap_root(work, "bad"), 0, key=key)
    with pytest.raises(ValueError, match=f"{key}.buffer_size: 10 elements, but a parameter chunk"):
        NVMeParamStore(_tiny_plan(), torch.float32, torch.device("cpu"), None, d,
                       buffer_size=10, max_in_cpu=0)
    with pytest.raises(ValueError, match=f"{key}.buffer_count: 0"):
        NVMeParamStore(_tiny_plan(), torch.float32, torch.device("cpu"), None, d, buffer_count=0)
    remove_swap_dir(d)


def _modify_and_step(work, stage, device):
    """In this process (world 1): two steps, then GatheredParameters(modifier_rank=0) zeroes a
    row of the first weight, then two more steps. Losses, the row right after the change, the
    final weights and the swap statistics."""
    import torch

    sys.path.insert(0, str(EXAMPLES))
    import dslaunch
    from dslaunch.zero import GatheredParameters
    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=8, n_layer=1, d_model=32, n_head=2))
    cfg = _config(stage, device, _swap_root(work, f"inproc{stage}") if device == "nvme" else None)
    cfg.update(train_batch_size=2, gradient_accumulation_steps=1)
    engine, *_ = dslaunch.initialize(model=model, config=cfg)
    weight = next(p for p in model.parameters() if p.dim() == 2)
    g = torch.Generator().manual_seed(1)
    losses, row = [], None
    for step in range(4):
        if step == 2:
            with GatheredParameters([weight], modifier_rank=0):
                weight.data[0].zero_()
            with GatheredParameters([weight]):
                row = weight.detach()[0].abs().max().item()
        tok = torch.randint(0, 256, (2, 8), generator=g)
        loss = engine(tok, tok)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    final = {k: v.clone() for k, v in engine.strategy.module_state_dict().items()}
    stats = engine.optimizer.swap_stats() if device == "nvme" else None
    return losses, row, final, stats, engine


@pytest.mark.parametrize("stage", [2, 3])
def test_gathered_parameters_modification_reaches_the_swapped_masters(work, stage):
    """With the fp32 masters in the swap file, a GatheredParameters(modifier_rank=0) change must
    reach them (stage 3: release_params; stage 2: sync_from_model): the run matches CPU offload
    bit for bit, and the masters rest in the file (storage-less in memory)."""
    import torch

    cpu = _modify_and_step(work, stage, "cpu")
    nvme = _modify_and_step(work, stage, "nvme")
    assert nvme[0] == cpu[0] and nvme[1] == cpu[1] == 0.0
    assert all(torch.equal(nvme[2][k], cpu[2][k]) for k in cpu[2])
    engine = nvme[4]
    assert nvme[3]["master_file_bytes"] > 0
    for g in engine.strategy.groups:
        assert g.master.untyped_storage().nbytes() == 0
        assert all(sp.untyped_storage().nbytes() == 0 for sp in g.shard_params)
    engine.optimizer.close()
