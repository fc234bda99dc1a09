"""Accelerate's DeepSpeedPlugin and Lightning's DeepSpeedStrategy on dslaunch's engine through
`dslaunch run --as-deepspeed`, on CPU, as far as each framework goes without a GPU
(docs/frameworks.md, "Accelerate" and "Lightning", says where they stop and why).

- Accelerate takes its DeepSpeed path only with an accelerator backend for several processes, so
  on CPU it trains one: ZeRO 2 and 3 through the plugin must give exactly the losses of plain
  Accelerate; two processes are refused by the engine with the batch Accelerate computed for one.
- Lightning's Trainer refuses DeepSpeedStrategy without CUDA (its own error); the strategy's own
  deepspeed.initialize, save_checkpoint, Lightning's zero-to-fp32 conversion and Fabric's
  load_checkpoint run on 2 ranks, ZeRO 2 and 3, against a single-process torch reference
  (tests/scripts/lightning_deepspeed.py).
"""

import subprocess

import pytest
import torch

from helpers import DSLAUNCH, ROOT, SCRIPTS, _tails, rank_env, results

FIXTURES_DIR = ROOT / "tests" / "fixtures"
AS_DS = ("--as-deepspeed",)


def _run(out, script, *args, nproc, as_deepspeed=True, check=True):
    cmd = [*DSLAUNCH, "run", *(["--as-deepspeed"] if as_deepspeed else []), "--nproc-per-node", str(nproc),
           "--omp-threads", "1", str(SCRIPTS / script), *map(str, args), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=240)
    if check:
        assert proc.returncode == 0, _tails(cmd, proc)
    return proc


@pytest.fixture(scope="module")
def plain_accelerate(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate-plain")
    _run(out, "frameworks_ddp.py", "--framework", "accelerate", nproc=1, as_deepspeed=False)
    return results(out, 1)[0]


@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_deepspeed_plugin_trains_as_plain_accelerate(tmp_path, plain_accelerate, stage):
    _run(tmp_path, "frameworks_ddp.py", "--framework", "accelerate", "--deepspeed-stage", stage, nproc=1)
    got = results(tmp_path, 1)[0]
    assert got["detected"]["distributed_type"] == "DistributedType.DEEPSPEED"
    assert got["detected"]["engine_module"] == "dslaunch.engine.core.engine"
    assert plain_accelerate["detected"]["ddp"] == "DistributedDataParallel"
    assert len(got["losses"]) == 11
    assert got["losses"] == plain_accelerate["losses"]  # fp32, one process: bit for bit
    resumed = got["losses"][-1]  # a step after save_state, the same step after load_state
    assert resumed[0] == resumed[1]
    assert got["param_sum"] == plain_accelerate["param_sum"]


def test_accelerate_with_a_dynamo_backend_compiles_through_the_engine(tmp_path, plain_accelerate):
    """Accelerator(dynamo_backend=...) with DeepSpeed calls engine.compile(backend=,
    compile_kwargs=) (Accelerate 1.15, for DeepSpeed >= 0.14.4): the module is compiled (the
    eager backend: dynamo's graphs run op by op) and trains to plain Accelerate's losses."""
    _run(tmp_path, "frameworks_ddp.py", "--framework", "accelerate", "--deepspeed-stage", 2,
         "--dynamo-backend", "eager", nproc=1)
    got = results(tmp_path, 1)[0]
    assert got["detected"]["engine_module"] == "dslaunch.engine.core.engine"
    assert got["detected"]["compiled"] is True
    assert got["losses"][:-1] == plain_accelerate["losses"][:-1]
    assert got["param_sum"] == pytest.approx(plain_accelerate["param_sum"], rel=1e-6)


def test_accelerate_deepspeed_on_two_cpu_processes_is_refused_clearly(tmp_path):
    proc = _run(tmp_path, "frameworks_ddp.py", "--framework", "accelerate", "--deepspeed-stage", 2, nproc=2,
                check=False)
    assert proc.returncode != 0
    assert ("ConfigError: train_batch_size: inconsistent batch sizes: train_batch_size=4 but "
            "train_micro_batch_size_per_gpu=4 * gradient_accumulation_steps=1 * world size 2 = 8") in proc.stderr


LIGHTNING_RUNS = {f"lightning_ds_s{stage}": (("--stage", stage, "--out", "{dir}"), None)
                  for stage in (2, 3)}


@pytest.mark.parametrize("stage", [2, 3])
def test_lightning_deepspeed_strategy_on_our_engine(job_cache, stage):
    """Both stages in one launch (JobCache.run_many: Lightning imported once per rank)."""
    job_cache.run_many("lightning_ds", "lightning_deepspeed.py", LIGHTNING_RUNS, flags=AS_DS,
                       timeout=240)
    args, _ = LIGHTNING_RUNS[f"lightning_ds_s{stage}"]
    job = job_cache.run(f"lightning_ds_s{stage}", "lightning_deepspeed.py", *args, flags=AS_DS,
                        timeout=240)
    ranks = job.results()
    for res in ranks:
        assert res["trainer_error"] == ("The DeepSpeed strategy is only supported on CUDA GPUs but "
                                        "`CPUAccelerator` is used.")
        assert res["lightning_config"]["zero_optimization"]["stage"] == stage
        assert (res["engine_module"], res["zero_stage"]) == ("dslaunch.engine.core.engine", stage)
        assert res["losses"] == pytest.approx(res["ref_losses"], rel=1e-6)
        assert res["optimizer_is_deepspeed_optimizer"] and not res["plain_optimizer_is_deepspeed_optimizer"]
        # Fabric's load_checkpoint into a fresh engine: weights and Adam moments are back (one more
        # step on the saved engine and on the resumed one gives the same loss), client state too
        assert res["resumed_global_step"] == 5
        assert res["after_resume"][0] == res["after_resume"][1]
    assert ranks[0]["losses"] == ranks[1]["losses"]
    converted = ranks[0]
    assert converted["converted_names"] and converted["converted_max_diff"] < 1e-6
    assert converted["converted_client"] == {"epoch": 0, "global_step": 5, "loops": {"fit_loop": {"step": 5}}}
    assert {"epoch", "global_step", "pytorch-lightning_version"} <= set(converted["converted_keys"])
    full = torch.load(job.dir / "fp32.pt", weights_only=False)
    assert sorted(full["state_dict"]) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]


@pytest.mark.parametrize("stage", [2, 3])
def test_state_file_finders_read_deepspeeds_own_layout(stage):
    """The names DeepSpeed 0.19.8's own get_optim_files / get_model_state_file return for the
    checkpoints it wrote (tests/fixtures/deepspeed_ckpt)."""
    from dslaunch.utils.zero_to_fp32 import get_model_state_file, get_optim_files

    d = FIXTURES_DIR / "deepspeed_ckpt" / f"zero{stage}" / "ckpt" / "global_step3"
    assert [p.rsplit("/", 1)[1] for p in get_optim_files(d)] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert get_model_state_file(d, stage).rsplit("/", 1)[1] == (
        "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt")
    with pytest.raises(FileNotFoundError, match="doesn't exist"):
        get_optim_files(d / "nothing")

